"""The email assistant (the ART-E case study) as an environment: search, read, answer with sources, and
"I don't know" rather than a guess.

Its world is an inbox store; a task is a question about one inbox (`context`: the inbox address) as seen
on the scenario's query date. Its task records and their judging are in tasks.py, its GRPO rollouts in
rollouts.py, its privacy pass in privacy_pass.py: EmailWorld hands the loop each of them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

from agent_rl.environments.email.prompts import SYSTEM_PROMPT, initial_messages
from agent_rl.environments.email.tools import InboxTools, ToolConfig, call_tool
from agent_rl.environments.answers import DeterministicJudge, Judge
from agent_rl.environments.core import (
    AnonymizerConfig,
    Environment,
    FinalAnswer,
    Grading,
    Judgement,
    PrivacySpec,
    StoredWorld,
    Task,
    Trajectory,
    World,
    WorldPrivacy,
)
from agent_rl.environments.email.inbox.store import open_inbox_store
from agent_rl.environments.email.inbox.store_interface import InboxStore
from agent_rl.environments.email.memo_judge import MemoJudge
from agent_rl.environments.email.tasks import NAME, judge_outcome, query_date_of, rubric_observation, scenario_task
from agent_rl.environments.rubric import RubricWeights, reward_bounds, score
from agent_rl.records import Outcome, Split
from agent_rl.environments.email.records import Category, Scenario


class EmailEnvironment(Environment):
    """Questions about an inbox store, answered with the search / read / answer tools."""

    name: ClassVar[str] = NAME
    categories: ClassVar[tuple[str, ...]] = tuple(c.value for c in Category)
    system_prompt: ClassVar[str] = SYSTEM_PROMPT

    def __init__(self, store: InboxStore | None = None, scenarios: list[Scenario] | None = None,
                 tools: ToolConfig | None = None, rubric: RubricWeights | None = None,
                 judge: Judge | None = None, store_url: str | None = None, tasks_path: str | None = None,
                 scenarios_path: str | None = None) -> None:
        """`store` and `scenarios` as objects, or where to find them (`store_url`, `tasks_path`: options a command
        line passes through the registry; `scenarios_path` is tasks_path's first name); neither: the demo world's,
        opened when first needed."""
        self.store = store
        self.store_url = store_url
        self._local = threading.local()  # the store opened from store_url for each thread that plays
        self._opened: list[InboxStore] = []
        self._opened_lock = threading.Lock()
        self._scenarios = scenarios
        self.scenarios_path = tasks_path or scenarios_path
        self.tool_config = tools or ToolConfig()
        self.rubric = rubric or RubricWeights()
        # Deterministic verdicts are remembered: served traffic replays the same scenarios over and over.
        self.answer_judge = judge or MemoJudge(DeterministicJudge())

    def tasks(self, split: Split) -> list[Task]:
        return [scenario_task(s) for s in self._all_scenarios() if s.split == split]

    def _all_scenarios(self) -> list[Scenario]:
        if self._scenarios is None:
            from agent_rl.environments.email.scenarios.demo import load_default_scenarios

            self._scenarios = load_default_scenarios(self.scenarios_path)
        return self._scenarios

    def grading(self) -> Grading:
        """The rubric's bounds (curation's range check), the demonstration quality below, and its own hacking
        detectors: unsupported answers (in no email the episode saw) and padded sources (cited, never read)."""
        from agent_rl.environments.email.hacking import DETECTORS

        return Grading(reward_range=reward_bounds(self.rubric), demonstration_quality=self._demonstration_quality,
                       hacking_detectors=dict(DETECTORS))

    def _demonstration_quality(self, reward: float) -> float:
        """The share of the correct tier's extra credit the episode earned (right sources, citation precision, turn
        efficiency): (reward - correct base) / (rubric maximum - correct base), clamped to [0, 1]. So 0.8 and up
        is a correct answer with the right citations and few turns, what the SFT warm-up should imitate."""
        span = reward_bounds(self.rubric)[1] - self.rubric.correct
        if span <= 0:
            return 1.0
        return round(min(1.0, max(0.0, (float(reward) - self.rubric.correct) / span)), 9)  # float noise at the top

    def _inbox_store(self) -> InboxStore:
        """The store given, else one at `store_url` per thread, opened when that thread first needs it (closed by
        close()): a backend keeps one connection per store, so threads playing at once do not queue on one."""
        if self.store is not None:
            return self.store
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = open_inbox_store(self.store_url)
            with self._opened_lock:
                self._opened.append(store)
        return store

    def open(self, task: Task) -> InboxTools:
        return InboxTools(self._inbox_store(), task.context, query_date_of(task), self.tool_config)

    def _close_stores(self) -> None:
        """Close the inbox stores this environment opened (one it was given stays the caller's)."""
        with self._opened_lock:
            opened, self._opened, self._local = self._opened, [], threading.local()
        for store in opened:
            store.close()

    def session_type(self) -> type:
        return InboxTools

    def opening_messages(self, task: Task) -> list[dict[str, Any]]:
        return initial_messages(task.context, task.prompt, query_date_of(task))

    def call(self, session: InboxTools, name: str, arguments: Any) -> str:
        return call_tool(session, name, arguments)

    def final_answer(self, session: InboxTools) -> FinalAnswer | None:
        trace = session.trace
        return FinalAnswer(trace.final_answer or "", list(trace.sources)) if trace.answered else None

    def judge(self, task: Task, session: InboxTools, trajectory: Trajectory) -> Judgement:
        outcome = Outcome.FORMAT_ERROR if trajectory.format_error else Outcome.RAN_OUT
        if trajectory.answer is not None and not trajectory.format_error:
            outcome = judge_outcome(task, trajectory.answer.text, self.answer_judge)
        if task.reference is None:
            return Judgement(outcome)  # live traffic: no reward without a reference
        observation = rubric_observation(task, session.trace, outcome, trajectory.turns, trajectory.max_turns,
                                         trajectory.format_error)
        result = score(observation, self.rubric)
        return Judgement(outcome, result.total, result.components)

    def world(self) -> EmailWorld:
        """Its inbox store and scenarios: built from a corpus, anonymized whole, reopened (EmailWorld)."""
        return EmailWorld(self)


class EmailWorld(World):
    """The email assistant's world: an inbox store built from a corpus (world.py), anonymized whole with the week's
    episodes under one set of pseudonyms (privacy_pass.py) and reopened from the folder curation wrote; GRPO plays
    it alone on that store with its own rows and rollouts (rollouts.py)."""

    trains_alone = True

    def __init__(self, environment: EmailEnvironment) -> None:
        super().__init__(environment)
        self.env = environment

    def replayable_tasks(self) -> list[Task]:
        """Every scenario's task, in the file's order; none while no scenarios were given, named or written to the
        default path (a new inbox serves live traffic before its scenarios exist)."""
        if self.env._scenarios is None and not self.env.scenarios_path:
            from agent_rl.environments.email.scenarios.demo import scenarios_path

            if not scenarios_path().exists():
                return []
        return [scenario_task(s) for s in self.env._all_scenarios()]

    def contexts(self) -> frozenset[str]:
        """Every inbox of the store, read afresh: a mailbox ingested after start-up is served."""
        return frozenset(self.env._inbox_store().inboxes())

    def teacher(self, **options: Any) -> Any:
        """The rule-based reader; `options` are HeuristicConfig's (error rates, seed, version): with error rates
        it stands in for a prompted API model (agent/api_models.toml)."""
        from agent_rl.environments.email.heuristic import HeuristicConfig, HeuristicPolicy

        return HeuristicPolicy(HeuristicConfig(**options)) if options else HeuristicPolicy()

    def close(self) -> None:
        self.env._close_stores()

    def privacy(self) -> PrivacySpec:
        # Who is a person comes from every inbox's headers: curation's anonymizer builds that directory itself
        # (agent_rl/privacy/directory.py build_directory), so no second reader of the headers here. The demo world's
        # sites, departments and cities are task answers, never a person's: they survive anonymization.
        from agent_rl.environments.email.inbox.demo_world import public_terms_of

        return PrivacySpec(id_fields=("task_id", "citations"),
                           public_terms=public_terms_of(self.env._inbox_store().inboxes()))

    def anonymize(self, episodes: list[dict[str, Any]], out_dir: Path, canaries: list[str],
                  config: AnonymizerConfig) -> WorldPrivacy:
        """The episodes, the inboxes and the scenarios under one set of pseudonyms (privacy_pass.py): the inbox
        store is written anonymized to `out_dir` (inbox.db, scenarios.jsonl) rather than copied with the
        environment. The demo world's public terms join the configured ones."""
        from agent_rl.environments.email.privacy_pass import anonymize_inboxes

        public = self.privacy().public_terms
        config = config.model_copy(update={"public_terms": tuple(dict.fromkeys([*config.public_terms, *public]))})
        env = self.env
        return anonymize_inboxes(env._inbox_store(), env._all_scenarios(), episodes, out_dir, canaries, config)

    def reopen(self, out_dir: Path) -> StoredWorld:
        """The anonymized inbox store and scenarios `anonymize` wrote under `out_dir` (inbox.db, scenarios.jsonl),
        reopened with the default tools, rubric and judge."""
        from agent_rl.environments.email.privacy_pass import SCENARIOS_FILE, STORE_FILE

        url = f"sqlite:///{Path(out_dir) / STORE_FILE}"
        return StoredWorld(EmailEnvironment(store_url=url, scenarios_path=str(Path(out_dir) / SCENARIOS_FILE)), url)

    def grpo_rows(self, tasks: list[Task]) -> list[dict[str, Any]]:
        """The scenarios of `tasks` as the rows its rollouts read (inbox, golden answer, gold sources, query date:
        grpo_rows.py), in the order given."""
        from agent_rl.environments.email.grpo_rows import grpo_rows

        scenarios = {scenario.id: scenario for scenario in self.env._all_scenarios()}
        return grpo_rows([scenarios[task.id] for task in tasks], split=None, environment=self.env)

    def build(self, **options: Any) -> dict[str, Any]:
        """The inbox store: a real export ingested (`ingest_path`), else the demo corpus of `seed` with `contexts`
        inboxes and `documents` emails in all (world.py's `n_inboxes`, `n_emails`)."""
        from agent_rl.environments.email.world import build_inboxes

        return build_inboxes(self.env._inbox_store(), **_email_options(options))

    def build_tasks(self, **options: Any) -> dict[str, Any]:
        """The scenarios about the inboxes `build` built, written where `tasks` reads them (world.py)."""
        from agent_rl.environments.email.scenarios.demo import scenarios_path
        from agent_rl.environments.email.world import write_scenarios

        path = Path(self.env.scenarios_path) if self.env.scenarios_path else scenarios_path()
        self.env._scenarios, meta = write_scenarios(self.env._inbox_store(), path, **_email_options(options))
        return meta

    def rollout_factory(self, max_turns: int) -> Any:
        """InboxEnvironments on this environment's inbox store (rollouts.py), scored by the rubric's groups."""
        from agent_rl.environments.email.rollouts import InboxEnvironment

        store, config = self.env._inbox_store(), self.env.tool_config
        return lambda: InboxEnvironment(store, config=config, max_turns=max_turns)


def _email_options(options: dict[str, Any]) -> dict[str, Any]:
    """The run's world settings in this world's words: `contexts` are inboxes, `documents` emails."""
    renamed = {"contexts": "n_inboxes", "documents": "n_emails"}
    return {renamed.get(key, key): value for key, value in options.items()}
