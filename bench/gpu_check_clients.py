"""The serving check's clients (``bench/gpu_serving.py``): streaming completions through the
``openai`` SDK, and what their timestamps say. Torch-free (the summaries are unit-tested).

One client process (``python -m bench.gpu_check_clients SPEC.json``) reads its spec (base
URL, model name, prompts, output length, a ``time.monotonic()`` start time), opens one
``AsyncOpenAI`` stream per prompt at that time, and prints one record per stream on
stdout: when it was sent, each text chunk's arrival and token count, the usage's
completion tokens, or the error. The serving check runs several such processes so that
the SDK's per-chunk parsing (tens of thousands of chunks a second at batch 128) is not
a single client process's CPU. ``time.monotonic`` is one clock for every process of the
host (Linux ``CLOCK_MONOTONIC``), so their records are compared as they are.

Tokens per chunk are counted as words: the check's tokenizer (word-level, one word a
token, joined by spaces) makes every token one word of the text, specials excepted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.gpu_check_worker import ROOT, child_env
from genpool_core.quantiles import percentile

if TYPE_CHECKING:
    import openai

READY_TIMEOUT_S = 60.0


@dataclass
class StreamRecord:
    sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens)
    tokens: int = 0  # the usage's completion tokens
    text: str = ""
    error: str | None = None


def sdk(base_url: str, timeout_s: float) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                              timeout=timeout_s)  # fmt: skip


async def one_stream(
    client: openai.AsyncOpenAI, model: str, prompt: list[int], max_tokens: int,
    **sampling: Any,
) -> StreamRecord:  # fmt: skip
    """One streaming completion of exactly ``max_tokens`` tokens (``min_tokens``: EOS does
    not end it early); ``sampling``: temperature, top_p, seed (default greedy)."""
    import openai

    record = StreamRecord(time.monotonic())
    params = {"temperature": 0.0} | sampling
    extra = {"min_tokens": max_tokens}
    try:
        response = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, stream=True, extra_body=extra,
            **params,
        )  # fmt: skip
        async for chunk in response:
            text = chunk.choices[0].text if chunk.choices else ""
            if text:
                record.chunks.append((time.monotonic(), len(text.split())))
                record.text += text
            if chunk.usage is not None:
                record.tokens = chunk.usage.completion_tokens
    except openai.OpenAIError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:500]
    if record.error is None and record.tokens != max_tokens:
        record.error = f"{record.tokens} of {max_tokens} tokens"
    return record


async def wave(spec: dict[str, Any], start_at: float) -> list[StreamRecord]:
    """Every prompt of ``spec`` at once, from ``start_at`` (monotonic seconds)."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    client = sdk(spec["url"], spec["timeout_s"])
    calls = [one_stream(client, spec["model"], p, spec["max_tokens"]) for p in spec["prompts"]]
    try:
        return list(await asyncio.wait_for(asyncio.gather(*calls), spec["timeout_s"]))
    finally:
        await client.close()


def summarize_wave(records: list[StreamRecord]) -> dict[str, Any]:
    """Output tokens/s over the wave (first send to last chunk) and in its steady window
    (from the last stream's first token to the first stream's last: every stream
    decoding), TTFT quantiles, and the failures."""
    done = [r for r in records if r.error is None and r.chunks]
    errors = [r.error for r in records if r.error is not None]
    out: dict[str, Any] = {"streams": len(records), "complete": len(done),
                           "errors": len(errors), "first_errors": errors[:3]}  # fmt: skip
    if not done:
        return out
    ttft = [r.chunks[0][0] - r.sent for r in done]
    start, end = min(r.sent for r in records), max(r.chunks[-1][0] for r in done)
    out |= {
        "output_tokens": sum(r.tokens for r in done),
        "wall_s": end - start,
        "wall_tok_s": sum(r.tokens for r in done) / (end - start),
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p90_ms": 1e3 * percentile(ttft, 90),
        "ttft_max_ms": 1e3 * max(ttft),
    }
    out |= steady_window(done)
    return out


def steady_window(records: list[StreamRecord]) -> dict[str, Any]:
    """Tokens/s of the chunks that arrived while every stream was past its first token
    and none had ended: (last first-chunk, first last-chunk]."""
    low = max(r.chunks[0][0] for r in records)
    high = min(r.chunks[-1][0] for r in records)
    tokens = sum(n for r in records for t, n in r.chunks if low < t <= high)
    if high <= low or tokens == 0:
        return {"steady_s": max(0.0, high - low), "steady_tokens": tokens, "steady_tok_s": None}
    return {"steady_s": high - low, "steady_tokens": tokens, "steady_tok_s": tokens / (high - low)}


def split(prompts: list[list[int]], per_process: int) -> list[list[list[int]]]:
    """``prompts`` in groups of at most ``per_process``, one group a client process."""
    return [prompts[i : i + per_process] for i in range(0, len(prompts), per_process)]


def parse_records(text: str) -> list[StreamRecord]:
    rows = json.loads(text)
    return [StreamRecord(r["sent"], [(t, n) for t, n in r["chunks"]], r["tokens"], r["text"],
                         r["error"]) for r in rows]  # fmt: skip


def sampling_summary(
    params: dict[str, Any], runs: list[StreamRecord], greedy: StreamRecord
) -> dict[str, Any]:
    """Seeded sampling ``runs`` (seed, the same seed, another seed) against greedy."""
    errors = [r.error for r in [*runs, greedy] if r.error is not None]
    same, again, other = runs
    return {
        "params": params,
        "ok": not errors,
        "errors": errors[:3],
        "identical_with_same_seed": same.text == again.text if not errors else None,
        "differs_with_other_seed": same.text != other.text if not errors else None,
        "differs_from_greedy": same.text != greedy.text if not errors else None,
        "text_head": same.text[:80],
    }


def serving_table(result: dict[str, Any], concurrency: Sequence[int]) -> list[dict[str, Any]]:
    """Per concurrency: model-only decode tok/s at that batch, the serving wave's steady
    and whole-wave tok/s and their ratios to it, TTFT."""
    model, serving = result.get("model_only"), result.get("serving")
    rows = []
    for c in concurrency:
        ref = model.get(f"b{c}") if isinstance(model, dict) else None
        ref_tok_s = ref.get("tok_s") if isinstance(ref, dict) else None
        wave = serving.get(f"c{c}") if isinstance(serving, dict) else None
        wave = wave if isinstance(wave, dict) else {}
        row: dict[str, Any] = {"concurrency": c, "model_only_tok_s": ref_tok_s}
        for key in ("steady_tok_s", "wall_tok_s", "ttft_p50_ms", "ttft_p90_ms", "errors"):
            row[key] = wave.get(key)
        for kind in ("steady", "wall"):
            value = row[f"{kind}_tok_s"]
            row[f"{kind}_ratio"] = value / ref_tok_s if value and ref_tok_s else None
        rows.append(row)
    return rows


def run_clients(specs: list[dict[str, Any]], timeout_s: float) -> tuple[list[StreamRecord], float]:
    """One client process per spec, all started before any sends (each marks itself
    ready once its SDK is imported, then reads the common start time on stdin); every
    stream's record, and that start time."""
    procs: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i, spec in enumerate(specs):
                (Path(tmp) / f"{i}.json").write_text(json.dumps(spec))
                cmd = [
                    sys.executable,
                    "-m",
                    "bench.gpu_check_clients",
                    str(Path(tmp) / f"{i}.json"),
                ]
                procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                              env=child_env()))  # fmt: skip
            _wait_ready(procs, [Path(tmp) / f"{i}.ready" for i in range(len(specs))])
            start_at = time.monotonic() + 0.2
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{start_at}\n")
                proc.stdin.flush()  # communicate() closes it
            return [r for proc in procs for r in _records(proc, timeout_s)], start_at
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _wait_ready(procs: list[subprocess.Popen[str]], marks: list[Path]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(mark.exists() for mark in marks):
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a client process exited: {proc.communicate()[1][-1500:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"client processes not ready within {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def _records(proc: subprocess.Popen[str], timeout_s: float) -> list[StreamRecord]:
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"a client process failed ({proc.returncode}): {err[-1500:]}")
    return parse_records(out)


def main() -> int:
    import openai  # noqa: F401 (imported before the ready mark, not during the wave)

    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    spec_path.with_suffix(".ready").touch()
    records = asyncio.run(wave(spec, float(sys.stdin.readline())))
    for record in records:
        record.text = record.text[:64]  # the text is not needed, only its length
    print(json.dumps([asdict(r) for r in records]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
