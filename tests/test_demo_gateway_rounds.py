"""The gateway demo's A/B traffic, sized to the decision (issue 64, item 2): users go to the test in chunks and the
rollout sensor looks after each, until the test promotes or rolls back or the bound (users, minutes) stops it.
The simulated-user program and the sensor are fakes (a clock the fakes move; lines in the sensor's format), but
for the last test, where the real sensor decides on simulated episodes in a real pool. Seconds, not minutes."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from demos.gateway import MAX_CHUNK, MIN_CHUNK, ABRun, Bound, ab_looks, next_chunk, parse_args, print_ab

HOLD = "hold (collecting): collecting: need 20 episodes per arm first | evidence: ratings alone (teacher: 1 rated)"
NO_DIFFERENCE = "hold (no_difference_yet): no significant difference yet (p=0.4000, lift +0.050) | evidence: x"
ADVANCE = "advance (significantly_better): advance to 50%: lift +0.300, p=0.0100 | evidence: x"
PROMOTE = "promote (significantly_better): promoted: lift +0.300 (CI +0.1..+0.5), p=0.0010 | evidence: x"
ROLLBACK = "rollback (significantly_worse): significantly worse: lift -0.300 | evidence: x"


class Fake:
    """The outside program and the sensor, on a clock of their own: a user takes `per_user_s` of traffic, a chunk's
    program start and waits `start_s`, a look `look_s`; the sensor answers `decisions` in turn (the last repeats)."""

    def __init__(self, decisions: list[str], per_user_s: float = 1.35, start_s: float = 2.0, look_s: float = 1.0):
        self.now, self.decisions, self.sent = 0.0, list(decisions), []
        self.per_user_s, self.start_s, self.look_s = per_user_s, start_s, look_s

    def clock(self) -> float:
        return self.now

    def send(self, n: int, number: int) -> dict:
        self.sent.append(n)
        self.now += self.start_s + n * self.per_user_s
        return {"seconds": n * self.per_user_s, "routing": {"teacher": 0.9, "v1": 0.1},
                "per_version": {"teacher": {"n": n - n // 10, "rated": 1, "rated_up": 1, "satisfied": n // 2},
                                "v1": {"n": n // 10, "rated": 0, "rated_up": 0, "satisfied": 0}}}

    def look(self) -> str:
        self.now += self.look_s
        return self.decisions.pop(0) if len(self.decisions) > 1 else self.decisions[0]

    def run(self, bound: Bound) -> ABRun:
        return ab_looks(self.send, self.look, bound, clock=self.clock, say=lambda line: None)


def test_the_traffic_stops_at_the_first_look_that_decides():
    for last in (PROMOTE, ROLLBACK):
        fake = Fake([HOLD, HOLD, NO_DIFFERENCE, last, HOLD])
        ab = fake.run(Bound(max_users=8000))
        assert ab.decided and len(ab.looks) == 4 and len(fake.sent) == 4
        assert ab.decision == last and ab.users == sum(fake.sent)
        assert ab.stop == f"the test decided ({last.split()[0]}) at look 4"


def test_an_advance_goes_on_and_the_next_chunk_is_measured_afresh():
    fake = Fake([HOLD, ADVANCE, NO_DIFFERENCE, PROMOTE], per_user_s=0.05, start_s=2.0)
    ab = fake.run(Bound(max_users=8000))
    assert [row.action for row in ab.looks] == ["hold", "advance", "hold", "promote"]
    # Before any measure and right after the step: the smallest chunk; otherwise sized to the look's cost.
    assert fake.sent[0] == MIN_CHUNK and fake.sent[2] == MIN_CHUNK and fake.sent[1] > MIN_CHUNK
    assert fake.sent[3] > MIN_CHUNK


def test_the_user_bound_stops_it_undecided_and_is_never_exceeded():
    fake = Fake([HOLD])
    ab = fake.run(Bound(max_users=110))
    assert not ab.decided and sum(fake.sent) == ab.users == 110
    assert fake.sent == [25, 25, 25, 25, 10]  # 1.35 s a user, ~3 s a look: the smallest chunks, the last one cut
    assert ab.stop == "the bound of 110 A/B users was reached"
    assert ab.decision.startswith("A/B test undecided after 110 users in ") and "(5 looks)" in ab.decision
    assert ab.decision.endswith(f"last look: {HOLD}")
    for users in (1, 7, 499, 1234):  # whatever the chunks, never one user more than the bound
        fake = Fake([NO_DIFFERENCE], per_user_s=0.01)
        assert fake.run(Bound(max_users=users)).users == sum(fake.sent) == users


def test_the_minutes_bound_starts_no_chunk_that_would_end_after_it():
    fake = Fake([HOLD], per_user_s=1.35, start_s=2.0, look_s=1.0)
    ab = fake.run(Bound(max_users=8000, max_minutes=5))
    assert not ab.decided and ab.users < 8000
    assert ab.seconds <= 5 * 60 + 1.35  # the estimate of a chunk's time errs by the look's cost at most
    assert ab.stop.startswith("the bound of 5 minutes was reached")
    # The same with fixed chunks of 100 users: the last one is cut to what fits.
    fake = Fake([HOLD], per_user_s=1.35, start_s=2.0, look_s=1.0)
    ab = fake.run(Bound(max_minutes=5, chunk=100))
    assert fake.sent[:2] == [100, 100] and fake.sent[2] < 100 and ab.seconds <= 5 * 60 + 1.35


def test_a_test_that_ended_elsewhere_stops_the_traffic():
    ab = Fake(["no A/B test running"]).run(Bound(max_users=1000))
    assert not ab.decided and len(ab.looks) == 1 and ab.stop.startswith("no A/B test runs any more")


def test_chunk_sizes_keep_a_look_a_tenth_of_the_traffic_within_bounds():
    bound = Bound(max_users=10_000)
    assert next_chunk(bound, 0, 0.0, None, 0.0) == (MIN_CHUNK, "")
    assert next_chunk(bound, 0, 0.0, 0.1, 3.0) == (300, "")  # 3 s a look = 10% of 300 users at 0.1 s
    assert next_chunk(bound, 0, 0.0, 1.35, 3.0) == (MIN_CHUNK, "")  # the full profile's 1.35 s a user
    assert next_chunk(bound, 0, 0.0, 0.001, 3.0) == (MAX_CHUNK, "")
    assert next_chunk(bound, 0, 0.0, 0.1, 3.0, remeasure=True) == (MIN_CHUNK, "")
    assert next_chunk(Bound(max_users=10_000, chunk=40), 0, 0.0, 0.001, 3.0) == (40, "")
    assert next_chunk(bound, 9_990, 0.0, 0.1, 3.0) == (10, "")
    assert next_chunk(bound, 10_000, 0.0, 0.1, 3.0)[0] == 0
    stop = next_chunk(Bound(max_minutes=1), 0, 55.0, 1.0, 5.0)
    assert stop[0] == 0 and "would end after it" in stop[1]
    with pytest.raises(ValueError):
        Bound()
    with pytest.raises(ValueError):
        Bound(max_users=0)


def test_options_bound_the_test_and_the_old_rounds_still_parse(capsys):
    fast, full = parse_args(["--fast"]), parse_args([])
    assert (fast.ab_max_users, fast.ab_max_minutes, fast.ab_chunk) == (2400, 10.0, None)
    assert (full.ab_max_users, full.ab_max_minutes) == (8000, 180.0)
    assert parse_args(["--ab-max-users", "300", "--ab-max-minutes", "2.5", "--ab-chunk", "50"]).ab_chunk == 50
    old = parse_args(["--fast", "--ab-users", "100", "--ab-rounds", "2"])
    assert old.ab_max_users == 200 and "deprecated" in old.deprecated and "deprecated" in capsys.readouterr().err
    assert parse_args(["--ab-rounds", "3"]).ab_max_users == 3000  # the full profile's rounds were 1,000 users
    for bad in (["--ab-users", "100", "--ab-max-users", "100"], ["--ab-chunk", "0"], ["--ab-max-users", "0"],
                ["--ab-max-minutes", "0"], ["--ab-rounds", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_summary_says_what_the_decision_needed_and_shows_each_steps_looks(capsys):
    fake = Fake([HOLD] * 6 + [NO_DIFFERENCE, ADVANCE, PROMOTE])
    ab = fake.run(Bound(max_users=8000))
    print_ab(ab, 20, 10, ab.decision)
    out = capsys.readouterr().out
    assert f"A/B traffic: the decision needed {ab.users} users in " in out and "(9 looks)" in out
    assert "the test decided (promote) at look 9" in out
    assert "sized so that a look costs ~10% of a chunk" in out and "a look's cost: median 3.0 s (sensor 1.00 s)" in out
    assert "step (teacher 90%, v1 10%): looks 1-9" in out
    assert "A/B look 1: +25 users (25 in all," in out and "... 4 more looks alike (hold (collecting))" in out
    assert "A/B look 6: " in out and "A/B look 3: " not in out
    assert "v1: 2 users, 0 rated, 0 up" in out and f"-> {PROMOTE}" in out
    assert "A/B live feedback over all looks: teacher: 9 rated of " in out

    undecided = Fake([HOLD]).run(Bound(max_users=60))
    print_ab(undecided, 20, 10, undecided.decision)
    out = capsys.readouterr().out
    assert ("A/B traffic: undecided, stopped after 60 users in " in out
            and ": the bound of 60 A/B users was reached (bound: 60 users)" in out)


def test_the_real_sensor_decides_and_the_traffic_stops_there(tmp_path):
    """Simulated users' episodes into a real pool, routed by the test's weights; the real rollout sensor looks after
    each chunk: a much better challenger advances and is promoted, and no user is sent after the promotion."""
    import dagster as dg

    from agent_rl import registry, settings
    from agent_rl.simulated_users.population import PopulationConfig, simulate
    from agent_rl.pool.repository import PoolRepository
    from pipelines.sensors import challenger_sensor, rollout_sensor
    from resources.registry import MlflowResource
    from resources.rollout import RolloutResource
    from resources.stores import PoolResource

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    resources = {"pool": PoolResource(), "mlflow": MlflowResource(tracking_uri=uri),
                 "rollout": RolloutResource(min_samples_per_arm=20, min_samples_per_step=20, tau_squared=0.09)}
    pool = PoolRepository(settings.pool_url())
    clock = Fake([HOLD])
    try:
        pool.set_routing({"teacher": 1.0}, specs={}, reason="production", actor="test")
        registry.register_policy_spec("heuristic", tracking_uri=uri)
        assert "A/B test started" in challenger_sensor(dg.build_sensor_context(resources=resources)).skip_message

        def send(n: int, number: int) -> dict:
            weights = pool.get_routing().weights
            draw = random.Random(number)
            versions = [draw.choices(list(weights), list(weights.values()))[0] for _ in range(n)]
            episodes = []
            for version, satisfied in (("teacher", 0.3), ("v1", 0.95)):
                count = versions.count(version)
                simulated = simulate(PopulationConfig(
                    n_episodes=count, satisfied_share=satisfied, rated_share=0.5, seed=number * 2 + (version == "v1"),
                    week_start=datetime.now(timezone.utc) + timedelta(seconds=1)))
                episodes += [s.episode.model_copy(update={"policy_version": version,
                                                          "episode_id": f"{number}-{version}-{i}"})
                             for i, s in enumerate(simulated)]
            pool.insert_episodes(episodes)
            clock.now += n * 1.35
            return {"seconds": n * 1.35, "routing": weights,
                    "per_version": {v: {"n": versions.count(v), "rated": 0, "rated_up": 0, "satisfied": 0}
                                    for v in weights}}

        def look() -> str:
            clock.now += 1.0
            return rollout_sensor(dg.build_sensor_context(resources=resources)).skip_message

        ab = ab_looks(send, look, Bound(max_users=5000), clock=clock.clock, say=lambda line: None)
    finally:
        pool.close()
    actions = [row.action for row in ab.looks]
    assert ab.decided and actions[-1] == "promote" and "advance" in actions, [r.decision for r in ab.looks]
    assert actions.count("promote") == 1 and ab.users < 5000
    assert ab.looks[-1].routing == {"teacher": 0.5, "v1": 0.5}  # the last chunk was served at the 50% step
    assert "evidence: ratings alone" in ab.looks[-1].decision
