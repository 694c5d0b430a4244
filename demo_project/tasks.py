"""The demo's tasks: those of both write-ups pgqueue started from, with the same payloads.

is_prime, collatz and sha256_chain compute results that can be checked independently
(bench/ recomputes every one of them).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pgqueue


@pgqueue.task(name="word_count")
def word_count(payload: dict[str, Any], job: Any) -> dict[str, int]:
    text = payload.get("text")
    if not isinstance(text, str):
        raise pgqueue.PermanentError('payload needs "text" (a string)')
    return {"words": len(text.split())}


@pgqueue.task(name="sum_words")
def sum_words(payload: Any, job: Any) -> dict[str, int]:
    """A workflow's last step: the words the word_count steps it waits for counted
    (``job.upstream_results``, by step name)."""
    counts = [r for r in job.upstream_results.values() if isinstance(r, dict)]
    return {"words": sum(int(r.get("words", 0)) for r in counts), "parts": len(counts)}


@pgqueue.task(name="noop")
def noop(payload: Any, job: Any) -> None:
    return None


@pgqueue.task(name="echo")
def echo(payload: Any, job: Any) -> Any:
    return payload


@pgqueue.task(name="slow")
def slow(payload: dict[str, Any], job: Any) -> dict[str, float]:
    """Sleeps ``seconds``, checking in with the worker every second (stops if the job was
    lost: its lease expired and someone else has it now)."""
    seconds = float(payload.get("seconds", 1))
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        if not job.heartbeat():
            break
    return {"slept": seconds}


@pgqueue.task(name="always_fail", max_attempts=3)
def always_fail(payload: Any, job: Any) -> None:
    raise RuntimeError(f"always_fail fails, as it should (attempt {job.attempt})")


@pgqueue.task(name="flaky")
def flaky(payload: Any, job: Any) -> dict[str, int]:
    """Fails on the first two attempts, then succeeds."""
    if job.attempt < 3:
        raise RuntimeError(f"flaky failure on attempt {job.attempt}")
    return {"attempt": job.attempt}


def _int(payload: dict[str, Any], name: str, low: int, high: int) -> int:
    value = payload.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise pgqueue.PermanentError(f'payload needs "{name}": an integer {low}..{high}')
    return value


def is_prime_value(n: int) -> dict[str, Any]:
    """Trial division by 2 and odd numbers up to √n."""
    checked = 0
    if n < 2:
        return {"n": n, "is_prime": False, "divisors_checked": 0}
    d = 2
    while d * d <= n:
        checked += 1
        if n % d == 0:
            return {"n": n, "is_prime": False, "divisors_checked": checked}
        d = 3 if d == 2 else d + 2
    return {"n": n, "is_prime": True, "divisors_checked": checked}


def collatz_value(n: int) -> dict[str, int]:
    """Steps of the 3n+1 walk down to 1, and a checksum of every value visited."""
    steps, checksum, x = 0, n, n
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
        checksum = (checksum * 31 + x) % 1_000_000_007
    return {"n": n, "steps": steps, "checksum": checksum}


def sha256_chain_value(seed: str, rounds: int) -> dict[str, str]:
    digest = seed.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return {"digest": digest.hex()}


@pgqueue.task(name="is_prime")
def is_prime(payload: dict[str, Any], job: Any) -> dict[str, Any]:
    return is_prime_value(_int(payload, "n", 0, 10**15))


@pgqueue.task(name="collatz")
def collatz(payload: dict[str, Any], job: Any) -> dict[str, int]:
    return collatz_value(_int(payload, "n", 1, 10**15))


@pgqueue.task(name="sha256_chain")
def sha256_chain(payload: dict[str, Any], job: Any) -> dict[str, str]:
    seed = payload.get("seed")
    if not isinstance(seed, str):
        raise pgqueue.PermanentError('payload needs "seed" (a string)')
    return sha256_chain_value(seed, _int(payload, "rounds", 0, 10_000_000))
