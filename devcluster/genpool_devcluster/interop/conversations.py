"""The multi-turn load of the precise prefix-cache interop (bench/kv_events_interop.py
outside Kubernetes, ``precise-prefix`` on the devcluster) and what its placements say: each
conversation's turn k is turn k-1's prompt, its reply and a new message, so turn k
shares every block of turn k-1 and a prefix-cache router should send it where turn k-1
ran. Pure: bodies in, records out, no I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Questions a user asks one after another; each conversation starts from its own system
# prompt.
QUESTIONS = (
    "What is the tallest mountain on the moon?",
    "How long would it take to walk there?",
    "And what would I need to carry?",
    "Could a rover do it faster?",
    "Which mission came closest?",
    "What did it find?",
    "Would you go?",
    "Why not?",
)
TOPICS = ("geology", "cooking", "sailing", "chess", "music", "gardening", "astronomy",
          "poetry", "carpentry", "beekeeping", "origami", "cartography")  # fmt: skip


@dataclass
class Conversation:
    """One user's conversation over one route: ``completions`` (the prompt grows as text)
    or ``chat`` (the messages grow; the worker's template renders them)."""

    index: int
    route: str
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt: str = ""

    def __post_init__(self) -> None:
        topic = TOPICS[self.index % len(TOPICS)]
        # Its number first: no two conversations share a full block, chat or completions.
        system = (f"#{self.index} is your name; you are a patient expert on {topic} who "
                  f"answers briefly and never repeats a question back to the user.")  # fmt: skip
        self.messages = [{"role": "system", "content": system}]
        self.prompt = f"system: {system}\n"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.route == "chat" else "/v1/completions"

    def body(self, turn: int, model: str, max_tokens: int) -> dict[str, Any]:
        """Turn ``turn``'s request (the user's next question added)."""
        question = QUESTIONS[turn % len(QUESTIONS)]
        common = {"model": model, "max_tokens": max_tokens, "temperature": 0}
        if self.route == "chat":
            self.messages.append({"role": "user", "content": question})
            return common | {"messages": list(self.messages)}
        self.prompt += f"user: {question}\nassistant:"
        return common | {"prompt": self.prompt}

    def answered(self, reply: dict[str, Any]) -> None:
        """The reply becomes part of the next turn's prompt."""
        choice = reply["choices"][0]
        if self.route == "chat":
            self.messages.append({"role": "assistant", "content": choice["message"]["content"]})
        else:
            self.prompt += choice["text"] + "\n"


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    route: str
    picked: str  # the epp's destination endpoint
    previous: str | None  # where the conversation's turn before ran
    scores: dict[str, float]  # the epp's score of each endpoint (--emit-endpoint-scores)
    prompt_tokens: int
    cached_tokens: int  # what the worker's prefix cache held (usage.prompt_tokens_details)

    @property
    def followed(self) -> bool | None:
        """Whether it ran where the turn before did (None for a first turn)."""
        return None if self.previous is None else self.picked == self.previous


def turn_record(conversation: Conversation, turn: int, picked: str, previous: str | None,
                scores: dict[str, Any], reply: dict[str, Any]) -> Turn:  # fmt: skip
    usage = reply.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Turn(conversation.index, turn, conversation.route, picked, previous,
                {k: float(v) for k, v in scores.items()}, int(usage.get("prompt_tokens", 0)),
                int(cached))  # fmt: skip


def summarise(turns: list[Turn], block_size: int) -> dict[str, Any]:
    """How often a later turn followed its conversation, with what scores and cache hits;
    where the first turns went (the epp's random tie-break: nothing is cached yet)."""
    later = [t for t in turns if t.previous is not None]
    followed = [t for t in later if t.followed]
    first_turns: dict[str, int] = {}
    for t in turns:
        if t.previous is None:
            first_turns[t.picked] = first_turns.get(t.picked, 0) + 1
    others = [s for t in later for e, s in t.scores.items() if e != t.picked]
    prompt = sum(t.prompt_tokens for t in later)
    cached = sum(t.cached_tokens for t in later)
    return {
        "turns": len(turns),
        "later_turns": len(later),
        "followed_previous": len(followed),
        "followed_fraction": round(len(followed) / len(later), 4) if later else None,
        "first_turns_by_endpoint": first_turns,
        "later_turns_with_a_cache_hit": sum(1 for t in later if t.cached_tokens > 0),
        "later_prompt_tokens": prompt,
        "later_cached_tokens": cached,
        "later_cached_fraction": round(cached / prompt, 4) if prompt else None,
        "picked_score_mean": _mean([t.scores.get(t.picked, 0.0) for t in later]),
        "other_score_mean": _mean(others),
        "block_size": block_size,
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def as_rows(turns: list[Turn]) -> list[dict[str, Any]]:
    return [asdict(t) | {"followed": t.followed} for t in turns]
