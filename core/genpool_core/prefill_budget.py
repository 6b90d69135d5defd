"""Chunked prefill: a per-pass prefill token budget (docs/design.md#scheduling-pass).

Without a budget an admitted request is prefilled whole in the pass that admits it, and
that pass's decode step waits for it: one 2k-token prompt stalls every running
request's next token for its whole prefill. With ``max_prefill_tokens_per_pass`` the
admitted requests that still need a prefill wait here, in admission order; each pass
hands out chunks, oldest first, until the budget is spent, so a pass costs one decode
step plus at most ``budget`` prefill tokens. A request joins the batch (and gets its
first token) in the pass its last chunk runs; until then it is a resident holding a
batch position and its KV blocks, but not a batch member: it gets no token, is counted
in no step, and no policy sees it (it can never be a pause victim).
"""

from __future__ import annotations

from genpool_core.request import GenRequest

# (request id, first prompt position, one past the last) of one pass's prefill work.
PrefillChunk = tuple[str, int, int]


class PrefillQueue:
    """Admitted requests with prefill left, oldest first, and how far each has got."""

    def __init__(self, budget: int) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"max_prefill_tokens_per_pass must be an int >= 1, got {budget!r}")
        self.budget = budget
        self._waiting: dict[str, GenRequest] = {}  # insertion order = admission order
        self._done: dict[str, int] = {}  # prompt tokens already prefilled

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def ids(self) -> tuple[str, ...]:
        return tuple(self._waiting)

    def add(self, request: GenRequest) -> None:
        """Prefill starts after the prompt tokens the prefix cache already holds."""
        self._waiting[request.request_id] = request
        self._done[request.request_id] = request.num_cached_tokens

    def remove(self, request_id: str) -> None:
        """A request that left mid-prefill (aborted)."""
        del self._waiting[request_id]
        del self._done[request_id]

    def num_prefilled(self, request_id: str) -> int:
        return self._done[request_id]

    def hand_out(self, *, is_decoding: bool) -> tuple[list[PrefillChunk], list[GenRequest]]:
        """This pass's chunks (within the budget, oldest first) and the requests whose
        prefill they complete (removed from here: the caller puts them in the batch).

        With nobody decoding (``is_decoding`` False) the oldest prompt is prefilled whole:
        there is no decode step to stall, and the engine runs the model only for a pass
        with batch members, so every pass that has chunks must have one.
        """
        chunks: list[PrefillChunk] = []
        completed: list[GenRequest] = []
        left = self.budget
        if not is_decoding and self._waiting:
            head_id, head = next(iter(self._waiting.items()))
            left = max(left, head.prompt_len - self._done[head_id])
        for request_id, request in list(self._waiting.items()):
            if left == 0:
                break
            start = self._done[request_id]
            end = min(request.prompt_len, start + left)
            chunks.append((request_id, start, end))
            left -= end - start
            if end == request.prompt_len:
                completed.append(request)
                self.remove(request_id)
            else:
                self._done[request_id] = end
        return chunks, completed
