"""Which chunks a request loads and saves: vLLM's token blocks ↔ ObjectCache chunk keys (pure).

One vLLM block of ``block_size`` tokens is one chunk object (``chunk_tokens == block_size``), so
chunk ``i`` of a prompt is the KV of block ``i`` of the request, and its key is the rolling prefix
hash of the prompt's first ``(i+1)·block_size`` tokens (:func:`client_sdk.chunk_keys`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..hashing import chunk_keys


@dataclass(frozen=True)
class ChunkTransfer:
    """Chunks to move between ObjectCache and vLLM's paged cache: ``keys[i]`` ↔ block ``block_ids[i]``."""

    req_id: str
    keys: tuple[str, ...]
    block_ids: tuple[int, ...]
    budget_s: float | None = None   # a load's own deadline (seconds from its start), if the request set one

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.block_ids):
            raise ValueError(f"request {self.req_id}: {len(self.keys)} keys but {len(self.block_ids)} blocks")


@dataclass
class RequestState:
    """What the scheduler side remembers about one request."""

    keys: list[str]      # one per full block of the prompt, then of the generated tokens as decoding fills blocks
    loadable: int        # how many of them a load may cover: vLLM always computes the prompt's last token
    stored: int = 0      # leading chunks known to be in ObjectCache or already handed to a save
    load: ChunkTransfer | None = field(default=None)
    salt: str | None = None

    @classmethod
    def for_prompt(cls, prompt_token_ids: Sequence[int], block_size: int, namespace: str, salt: str | None = None) -> "RequestState":
        """``salt``: the request's ``cache_salt`` (its keys then never meet another salt's or an unsalted request's)."""
        n = len(prompt_token_ids)
        keys = chunk_keys(list(prompt_token_ids), block_size, namespace, salt) if n >= block_size else []
        return cls(keys=keys, loadable=loadable_chunks(n, block_size), salt=salt)

    def extend(self, token_ids: Sequence[int], computed_tokens: int, block_size: int, namespace: str) -> None:
        """Keys for every block whose KV is computed by now, generated tokens included (for the next turn's prompt)."""
        full = min(computed_tokens, len(token_ids)) // block_size
        if full > len(self.keys):
            self.keys = chunk_keys(list(token_ids[:full * block_size]), block_size, namespace, self.salt)


def loadable_chunks(num_prompt_tokens: int, block_size: int) -> int:
    """Full blocks before the prompt's last token: a hit may cover at most these (vLLM must compute ≥ 1 token)."""
    return max(0, num_prompt_tokens - 1) // block_size


def external_tokens(hit_chunks: int, num_computed_tokens: int, block_size: int) -> int:
    """Tokens ObjectCache holds beyond the ``num_computed_tokens`` vLLM already has (0 if none)."""
    return max(0, hit_chunks * block_size - num_computed_tokens)


def load_transfer(req_id: str, keys: Sequence[str], block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int,
                  block_size: int) -> ChunkTransfer:
    """The chunks covering tokens ``[num_computed, num_computed + num_external)`` and the blocks they land in."""
    if num_computed_tokens % block_size or num_external_tokens % block_size:
        raise ValueError(f"request {req_id}: a load must start and end on block boundaries "
                         f"({num_computed_tokens} + {num_external_tokens} tokens, block size {block_size})")
    first, count = num_computed_tokens // block_size, num_external_tokens // block_size
    if first + count > min(len(keys), len(block_ids)):
        raise ValueError(f"request {req_id}: chunks [{first}, {first + count}) but {len(keys)} keys and {len(block_ids)} blocks")
    return ChunkTransfer(req_id, tuple(keys[first:first + count]), tuple(block_ids[first:first + count]))


def chunks_to_save(state: RequestState, tokens_computed_after_step: int, block_size: int) -> range:
    """Chunks (prompt or generated) that become complete in this step and are not stored yet."""
    end = min(len(state.keys), tokens_computed_after_step // block_size)
    return range(state.stored, max(state.stored, end))


def merge(transfers: Iterable[ChunkTransfer]) -> tuple[list[str], list[int], list[int]]:
    """All transfers as one fetch or put: ``(keys, chunk_index, block_ids)``.

    Each key appears once in ``keys`` (two requests may share a prefix); entry ``j`` says that
    chunk ``keys[chunk_index[j]]`` belongs in block ``block_ids[j]``. A load fills every listed
    block; a save gathers each key from the first block that holds it.
    """
    keys: list[str] = []
    index: dict[str, int] = {}
    chunk_index: list[int] = []
    block_ids: list[int] = []
    for t in transfers:
        for key, block in zip(t.keys, t.block_ids):
            if key not in index:
                index[key] = len(keys)
                keys.append(key)
            chunk_index.append(index[key])
            block_ids.append(block)
    return keys, chunk_index, block_ids


def load_budget(transfers: Iterable[ChunkTransfer], default_s: float) -> float | None:
    """The deadline of one merged load: the tightest of its requests' budgets and the deployment's (0: none)."""
    budgets = [t.budget_s for t in transfers if t.budget_s] + ([default_s] if default_s > 0 else [])
    return min(budgets) if budgets else None


def first_blocks(keys: Sequence[str], chunk_index: Sequence[int], block_ids: Sequence[int]) -> list[int]:
    """For a save: the block each of ``keys`` is gathered from (the first that holds it)."""
    first: dict[int, int] = {}
    for c, b in zip(chunk_index, block_ids):
        first.setdefault(c, b)
    return [first[c] for c in range(len(keys))]
