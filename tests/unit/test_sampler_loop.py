"""node/sampler.loop's timing: which polls read the energy counter, and when summaries go.

The loop runs over a fake sampler whose clock moves while it polls (a poll of 4 GPUs on a
driver takes tens of ms, jittering) and while it waits (each wake-up a little late), for an
hour of polls: every checkpoint and scheduled live copy must follow a poll that read the
counter (their energy ends with their window), polls between them read it only every
ENERGY_EVERY_S, and a checkpoint still comes at least every checkpoint_s."""

from __future__ import annotations

import random
from typing import Any

import pytest

from slurm_gpu_eff.config import Config
from slurm_gpu_eff.node import sampler as sampler_module
from slurm_gpu_eff.node.sampler import ENERGY_EVERY_S, loop

HOUR = 3600.0


class Clock:
    def __init__(self, seed: int) -> None:
        self.now = 1000.0
        self.rng = random.Random(seed)


class FakeSampler:
    """What loop() asks of a Sampler; a poll's counter read lies mid-poll."""

    def __init__(self, clock: Clock, config: Config) -> None:
        self.clock, self.config = clock, config
        self.job = None
        self.wait_s = config.interval_s
        self.counter_at: float | None = None  # when the counter was last read
        self.counter_reads = 0
        self.ended_at = 0.0  # when the last poll ended
        self._next = 0.0

    def monotonic(self) -> float:
        return self.clock.now

    def sample_once(self, full: bool = True) -> None:
        energy_counter = full or self.clock.now >= self._next  # as Sampler.sample_once
        if energy_counter:
            self._next = self.clock.now + ENERGY_EVERY_S
        took = 4 * self.clock.rng.uniform(0.008, 0.012)
        self.clock.now += took / 2
        if energy_counter:
            self.counter_at = self.clock.now
            self.counter_reads += 1
        self.clock.now += took / 2
        self.ended_at = self.clock.now

    def idle_level(self) -> int:
        return 0

    def snapshot(self, status: str, reason: str = "") -> tuple[float, float | None]:
        return self.ended_at, self.counter_at


class Stopper:
    requested = False
    epilog = False

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def wait(self, seconds: float) -> None:
        self.clock.now += max(seconds, 0.0) + self.clock.rng.uniform(0.00005, 0.0005)
        self.requested = self.clock.now > 1000.0 + HOUR


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_summaries_follow_a_counter_read_and_the_counter_waits_its_cadence(
    seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    summaries: list[tuple[str, float, tuple[float, float | None]]] = []
    clock = Clock(seed)

    class Live:
        def __init__(self, *args: Any) -> None:
            pass

        def post(self, snapshot: tuple[float, float | None]) -> bool:
            summaries.append(("live", clock.now, snapshot))
            return True

        def reap(self) -> None:
            pass

    class Orphan:
        def __init__(self, *args: Any) -> None:
            pass

        def ended(self) -> bool:
            return False

    monkeypatch.setattr(sampler_module, "LiveDelivery", Live)
    monkeypatch.setattr(sampler_module, "OrphanWatch", Orphan)
    monkeypatch.setattr(sampler_module, "squeue_for", lambda config: None)
    monkeypatch.setattr(sampler_module, "export_live", lambda sampler, log: None)
    monkeypatch.setattr(sampler_module, "checkpoint",
                        lambda path, snapshot, log: summaries.append(("checkpoint", clock.now, snapshot)))
    monkeypatch.setattr(sampler_module.os.path, "isdir", lambda path: True)
    fake = FakeSampler(clock, Config(interval_s=1.0, checkpoint_s=60.0, live_s=45.0))
    loop(fake, Stopper(clock), "/job", None, None)  # type: ignore[arg-type]

    # the last is the SIGTERM path's complete summary, after a whole reading
    stale = [(kind, ended - read) for kind, _, (ended, read) in summaries
             if read is None or ended - read > 0.1]
    assert stale == []
    checkpoints = [at for kind, at, _ in summaries if kind == "checkpoint"]
    assert len(checkpoints) >= HOUR / 60.0
    assert max(b - a for a, b in zip(checkpoints, checkpoints[1:], strict=False)) <= 60.0 + 0.5
    live = [at for kind, at, _ in summaries if kind == "live"]
    assert len(live) >= HOUR / 45.0 - 1
    # between summaries the counter waits its cadence: far fewer reads than polls
    assert fake.counter_reads <= HOUR / ENERGY_EVERY_S + len(summaries) + 1
