"""Deterministic sampling of interruptions: for a seed, the same faults at the same times on the same GPUs."""

import random
from dataclasses import dataclass

from simulator.profiles import PRECURSOR_SHARE, Profile, manifestation, root_cause_mix


@dataclass(frozen=True)
class Strike:
    at_hours: float  # when it strikes, hours from the start
    component: str  # the root cause (Llama 3 Table 5)
    kind: str  # the fault Lockstep sees
    xid: int | None
    precursor: str  # "" when it strikes without warning
    channel: str
    gpu: int  # which GPU of the fleet, 0 … gpus-1


class FaultSampler:
    """A Poisson process of interruptions at the profile's rate over ``gpus`` GPUs, root causes from the mix."""

    def __init__(self, profile: Profile, gpus: int, seed: int):
        self.profile = profile
        self.gpus = gpus
        self.random = random.Random(seed)
        self.components, self.weights = root_cause_mix()
        self.now_hours = 0.0

    def next(self) -> Strike:
        self.now_hours += self.random.expovariate(self.profile.rate_per_gpu_hour * self.gpus)
        component = self.random.choices(self.components, weights=self.weights)[0]
        seen = manifestation(component)
        warned = (
            self.random.random()
        )  # drawn for every strike: a change of mix leaves the other draws as they were
        precursor = seen.precursor if seen.precursor and warned < PRECURSOR_SHARE else ""
        return Strike(
            self.now_hours,
            component,
            seen.kind,
            seen.xid,
            precursor,
            seen.channel,
            self.random.randrange(self.gpus),
        )

    def until(self, hours: float) -> list[Strike]:
        """Every strike from the current time up to ``hours`` (the next one past it is kept for later)."""
        strikes = []
        while True:
            saved = (self.random.getstate(), self.now_hours)
            strike = self.next()
            if strike.at_hours > hours:
                self.random.setstate(saved[0])
                self.now_hours = saved[1]
                return strikes
            strikes.append(strike)
