"""Random-weight Llama models built offline for ``bench vllm`` (no downloads): the tiny one and ~0.5B.

Seeded (every process builds the same weights), with a byte-level BPE tokenizer trained on a few
sentences; prompts are token ids, so the tokenizer only has to exist. The output head is scaled
up so greedy decoding has clear winners: equal first tokens across paths then test the KV, not
floating-point ties.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SENTENCES = [
    "ObjectCache keeps prefix KV cache in S3-compatible object storage.",
    "The serving engine loads layer by layer while it computes the previous layer.",
    "A rolling prefix hash names every chunk of tokens; equal keys mean equal prefixes.",
    "vLLM pages its KV cache in blocks; one block of tokens becomes one chunk object.",
]
VOCAB = 512  # asked of the BPE trainer; a few sentences give fewer merges (see :func:`vocabulary`)


@dataclass(frozen=True)
class ModelSize:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def parameters(self) -> int:
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (attn + 3 * self.hidden * self.intermediate)  # the embeddings are tiny (a few hundred tokens)

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


SIZES = {
    "tiny": ModelSize("tiny", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2),
    # ~0.44B parameters: prefill dominates (2,000 tokens take seconds on two cores).
    "0.5b": ModelSize("0.5b", layers=28, hidden=1024, intermediate=4096, heads=16, kv_heads=8),
}


def vocabulary(path: str | Path) -> int:
    """The built model's vocabulary size: prompts draw token ids below it."""
    return int(json.loads((Path(path) / "config.json").read_text())["vocab_size"])


def build(path: str | Path, size: ModelSize, seed: int = 0) -> Path:
    """Write the model and tokenizer to ``path`` (kept: a second call with the same size reuses it)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path) / f"llama-{size.name}-seed{seed}"
    if (path / "config.json").exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(tmp)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=size.hidden, intermediate_size=size.intermediate,
                         num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
                         head_dim=size.head_dim, max_position_embeddings=8192, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.save_pretrained(tmp)
    tmp.rename(path)
    return path
