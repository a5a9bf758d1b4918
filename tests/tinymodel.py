"""A tiny Llama built offline in seconds, for tests that run a real vLLM engine (no downloads).

Random weights (seeded, so every process builds the same model), 2 layers, hidden 128, 4 attention
heads over 2 KV heads of head_dim 32, and a byte-level BPE tokenizer trained on a few sentences.
The output head's weights are scaled up so greedy decoding has clear winners: exact token
comparisons across runs then test the KV, not floating-point ties.
"""

from __future__ import annotations

import sys
from pathlib import Path

SENTENCES = [
    "ObjectCache keeps prefix KV cache in S3-compatible object storage.",
    "The serving engine loads layer by layer while it computes the previous layer.",
    "A rolling prefix hash names every chunk of tokens; equal keys mean equal prefixes.",
    "vLLM pages its KV cache in blocks; one block of tokens becomes one chunk object.",
    "The quick brown fox jumps over the lazy dog, again and again, all day long.",
]


def build(path: str | Path, seed: int = 0) -> Path:
    """Write the model and tokenizer to ``path`` (idempotent) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False,
                         torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.save_pretrained(path)
    return path


if __name__ == "__main__":
    print(build(sys.argv[1]))
