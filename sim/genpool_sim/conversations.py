"""Multi-turn conversations (``--conversations``): a shared system prompt, then turns whose
prompt is the whole history plus a new message (docs/sim.md#conversations).

Open loop across conversations (Gamma starts at ``rate`` per second), closed within one:
turn k + 1 arrives when turn k's reply has finished plus a think time. Everything a
conversation will send (its system prompt, turns, message and reply lengths, think
times) is drawn up front from the seed, so a run with prefix caching and one without
send the same conversations; only the later turns' arrival times follow the replies.

The simulator has no token ids, so each conversation's token stream is synthesized: the
system prompt's tokens are a function of (system prompt, position), every later token of
(conversation, position), and blocks are hashed with the product's own chain
(:func:`genpool_core.block_hash.block_hashes`), so equal prefixes give equal hashes:
every conversation of a system prompt shares its blocks, and turn k + 1's prompt starts
with turn k's prompt and reply.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from genpool_core.block_hash import BlockHash, block_hashes
from genpool_core.field_help import DESCRIPTION
from genpool_sim.cluster import Cluster
from genpool_sim.records import SimRequest
from genpool_sim.workload import LengthSampler, TraceRequest

_MAX_TURNS = 64
_MASK = 0xFFFFFFFF  # token ids are 32 bits in the hash's encoding
_STREAM_MUL = 0x9E3779B1  # odd: for a given position, stream -> token is one to one
_POSITION_MUL = 0x85EBCA6B


@dataclass(frozen=True)
class ConversationSettings:
    rate: float = field(
        metadata={DESCRIPTION: "conversations started per second (open loop, Gamma gaps with --cv)"}
    )
    system_prompt_tokens: int = field(
        default=1024,
        metadata={DESCRIPTION: "tokens of the system prompt every conversation starts with"},
    )
    system_prompts: int = field(
        default=1,
        metadata={
            DESCRIPTION: "distinct system prompts; conversation i uses prompt i mod this"
            " (1: all conversations share one)"
        },
    )
    turns: float = field(
        default=4.0,
        metadata={DESCRIPTION: "mean turns per conversation (geometric, at least 1)"},
    )
    think_s: float = field(
        default=10.0,
        metadata={
            DESCRIPTION: "mean seconds (exponential) between a reply's last token and the"
            " next message"
        },
    )
    message_scale: float = field(
        default=0.25,
        metadata={
            DESCRIPTION: "a user message's length: a trace prompt length drawn with its reply,"
            " times this (the trace's prompts hold whole histories)"
        },
    )
    max_context_tokens: int = field(
        default=8192,
        metadata={
            DESCRIPTION: "a conversation ends before a turn whose prompt and reply would pass"
            " this many tokens"
        },
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"conversation rate must be > 0, got {self.rate!r}")
        if self.system_prompt_tokens < 0 or self.system_prompts < 1:
            raise ValueError("need system prompt tokens >= 0 and at least one system prompt")
        if not (self.turns >= 1 and self.think_s >= 0 and self.message_scale > 0):
            raise ValueError("need turns >= 1, think time >= 0 and message scale > 0")
        if self.max_context_tokens < self.system_prompt_tokens + 2:
            raise ValueError("the context must hold the system prompt, a message and a reply")


@dataclass(frozen=True, slots=True)
class Turn:
    message_tokens: int
    reply_tokens: int
    think_s: float  # after the previous reply (0 for the first turn)


@dataclass(frozen=True, slots=True)
class Conversation:
    index: int
    start_s: float
    system: int  # which system prompt
    system_tokens: int
    turns: tuple[Turn, ...]

    def prompt_tokens(self, turn: int) -> int:
        """Turn ``turn``'s prompt (0-based): system, every earlier exchange, its message."""
        earlier = sum(t.message_tokens + t.reply_tokens for t in self.turns[:turn])
        return self.system_tokens + earlier + self.turns[turn].message_tokens

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens(len(self.turns) - 1) + self.turns[-1].reply_tokens

    def token_ids(self) -> list[int]:
        """The synthetic tokens of the whole conversation, its last reply included."""
        split = self.system_tokens
        system, own = 2 * self.system, 2 * self.index + 1  # disjoint stream ids
        return [_token(system if p < split else own, p) for p in range(self.num_tokens)]

    def block_hashes(self, block_size: int) -> list[BlockHash]:
        """Every full block's hash, as a worker hashes them (the product's chain)."""
        return block_hashes(self.token_ids(), block_size)


def _token(stream: int, position: int) -> int:
    return (stream * _STREAM_MUL + position * _POSITION_MUL) & _MASK


def draw_conversations(
    settings: ConversationSettings,
    cv: float,
    duration_s: float,
    lengths: Sequence[TraceRequest],
    rng: random.Random,
) -> list[Conversation]:
    """Conversations starting in ``[0, duration_s]``: Gamma gaps of mean ``1 / rate`` and
    coefficient of variation ``cv``; per conversation its turns, from ``rng`` in order."""
    sampler = LengthSampler(lengths, rng)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (settings.rate * shape)
    out: list[Conversation] = []
    now = rng.gammavariate(shape, scale)
    while now <= duration_s:
        turns = _draw_turns(settings, sampler, rng)
        if turns:
            system = len(out) % settings.system_prompts
            out.append(Conversation(len(out), now, system, settings.system_prompt_tokens, turns))
        now += rng.gammavariate(shape, scale)
    return out


def _draw_turns(
    settings: ConversationSettings, sampler: LengthSampler, rng: random.Random
) -> tuple[Turn, ...]:
    count = 1
    while count < _MAX_TURNS and rng.random() >= 1.0 / settings.turns:
        count += 1
    turns: list[Turn] = []
    context = settings.system_prompt_tokens
    for k in range(count):
        prompt, reply = sampler.sample()
        message = max(1, round(prompt * settings.message_scale))
        think = rng.expovariate(1.0 / settings.think_s) if k and settings.think_s > 0 else 0.0
        if context + message + reply > settings.max_context_tokens:
            break  # the context is full: the conversation ends
        turns.append(Turn(message, reply, think))
        context += message + reply
    return tuple(turns)


def run_conversations(
    cluster: Cluster,
    conversations: Sequence[Conversation],
    duration_s: float,
    submit: Callable[[SimRequest], None],
) -> None:
    """Each conversation's first turn at its start, each later one when the previous
    reply has finished plus its think time; nothing is sent at or after ``duration_s``."""
    block_size = cluster.config.kv_block_size
    chains: dict[int, list[BlockHash]] = {}

    def send(conversation: Conversation, turn: int, at: float) -> None:
        if at >= duration_s:
            return
        if conversation.index not in chains:
            chains[conversation.index] = conversation.block_hashes(block_size)
        prompt = conversation.prompt_tokens(turn)
        reply = conversation.turns[turn].reply_tokens
        request = SimRequest(f"v{conversation.index}-{turn + 1}", at, prompt, reply)
        request.conversation, request.turn = conversation.index, turn + 1
        request.block_hashes = chains[conversation.index][: (prompt + reply) // block_size]
        if turn + 1 == len(conversation.turns):
            del chains[conversation.index]  # its last turn: the chain is no longer needed
        submit(request)

    def on_done(request: SimRequest, now: float) -> None:
        assert request.conversation is not None and request.turn is not None
        conversation = conversations[request.conversation]
        if request.turn < len(conversation.turns):
            turn = conversation.turns[request.turn]
            send(conversation, request.turn, now + turn.think_s)

    cluster.on_done = on_done
    for conversation in conversations:
        send(conversation, 0, conversation.start_s)
    cluster.run()
