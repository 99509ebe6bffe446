"""The environment contract: what the loop needs to know about an agent it trains, and nothing about email.

An environment is a plug-in (`registry.py` finds it by name, import path or entry point). It declares its
name and task categories, provides tasks by split, opens one tool session per task whose public methods
are the tools (as TRL's `environment_factory` expects: typed arguments, Google-style docstrings), and
judges a finished episode. Everything else in the loop (pool, curation, SFT, GRPO, evaluation, A/B) works
from these records. No torch, no Dagster and no email code here.
"""

from __future__ import annotations

import abc
import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, final

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from agent_rl.records import Outcome, Split

if TYPE_CHECKING:
    from pathlib import Path

    from agent_rl.environments.hacking import Detector
    from agent_rl.environments.policy import Policy


class Task(BaseModel):
    """One thing to do in an environment, with what success looks like when it is known."""

    model_config = ConfigDict(frozen=True)

    id: str
    environment: str
    context: str = Field(description="the world the task runs in: a mailbox address, a store database, ...")
    prompt: str = Field(description="what the user asks, as the opening user message")
    reference: str | None = Field(None, description="the reference answer or expected outcome (None: unknown)")
    category: str | None = Field(None, description="one of the environment's categories (None: live traffic)")
    split: Split = Split.TRAIN
    metadata: dict[str, Any] = Field(default_factory=dict, description="free, JSON-serializable")


@dataclass
class FinalAnswer:
    """What a session recorded as the episode's end: the answer text and what it cites."""

    text: str
    citations: list[str] = field(default_factory=list)


@dataclass
class Trajectory:
    """A finished episode as a judge sees it."""

    messages: list[dict[str, Any]]
    turns: int
    max_turns: int
    format_error: str | None = None  # a FormatErrorKind value when the policy broke the format
    answer: FinalAnswer | None = None


@dataclass
class Judgement:
    """A judge's verdict: the outcome, and the reward with its rubric components (None where not judged)."""

    outcome: Outcome
    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)


@dataclass
class ProbeItem:
    """A general question without tools, for the forgetting gate: right when the reply contains `expected`."""

    question: str
    expected: tuple[str, ...]


@dataclass
class PrivacySpec:
    """Which of an environment's data carries personal information.

    `id_fields` are episode/task metadata keys holding identifiers that keep their shape but lose names
    (pseudonymized the same way wherever they occur, so citations still match). Free text (messages,
    answers, prompts) is always anonymized. `known_people(context)` gives names and addresses the environment
    knows to be personal in a context (a mailbox's senders, a store's customers), so they are replaced even
    where a recognizer would miss them. `public_terms` are names that are never a person's.
    """

    id_fields: tuple[str, ...] = ()
    known_people: Callable[[str], Iterable[tuple[str, str]]] | None = None  # (display name, address) pairs
    # Names in the world that belong to no person (products, places): a name detector must leave them, or an
    # anonymized task would ask for a product the world does not have.
    public_terms: tuple[str, ...] = ()


# The personal data curation's anonymizer replaces (Presidio entity types).
DEFAULT_ENTITIES = (
    "PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IP_ADDRESS", "URL", "US_SSN", "IBAN_CODE",
    "STREET_ADDRESS", "ACCOUNT_NUMBER",
)
# JSON keys whose values are dates or call ids: they must survive unchanged.
KEEP_KEYS = ("tool_call_id", "date", "query_date")
# JSON keys whose values are ids (of emails, tasks, citations): the names and addresses inside them are pseudonymized
# by curation's `pseudonymize_id`, the same way everywhere, so an episode's cited sources still match its world.
ID_KEYS = ("id", "message_id", "citations", "sources", "source_ids", "task_id", "scenario_id")


class AnonymizerConfig(BaseModel):
    """Curation's anonymizer settings (agent_rl/privacy/anonymize.py), handed to a world's own `World.anonymize`:
    what to look for and how; the key comes from AGENT_RL_PSEUDONYM_KEY unless given here."""

    model_config = ConfigDict(frozen=True)

    entities: tuple[str, ...] = Field(DEFAULT_ENTITIES, description="Presidio entity types replaced by surrogates")
    score_threshold: float = Field(0.35, ge=0, le=1, description="minimum analyzer score (phones score 0.4)")
    ner: bool = Field(True, description="run spaCy NER (names not in any header); off = patterns + directory only")
    ner_batch_size: int = Field(64, ge=1, description="lines per nlp.pipe batch")
    name_finder: bool = Field(
        True, description="second name recognizer: name lists, context and Lotus Notes layout (names.py)"
    )
    learn_names: bool = Field(
        True, description="names NER finds anywhere are replaced everywhere, so answers stay consistent"
    )
    keep_keys: tuple[str, ...] = Field(KEEP_KEYS, description="JSON keys whose values stay as they are")
    id_keys: tuple[str, ...] = Field(ID_KEYS, description="JSON keys whose values are ids: names in them pseudonymized")
    key: SecretStr | None = Field(None, description="pseudonym key; default from AGENT_RL_PSEUDONYM_KEY")
    public_terms: tuple[str, ...] = Field((), description="names that are never a person's (an environment's "
                                          "product or place names): a detected name made only of their words stays")


@dataclass
class WorldPrivacy:
    """What a world's own privacy pass (`World.anonymize`) gives curation: the anonymized episodes,
    the privacy report and the auditor's findings (the blocking gate reads them), and what it wrote of its world."""

    episodes: list[dict[str, Any]]
    report: dict[str, Any]
    leaks: list[Any] = field(default_factory=list)
    world: dict[str, Any] = field(default_factory=dict)  # the anonymized world's summary, for the run's metadata


# The category of an episode whose client named none (live traffic): balancing and the diversity gate see it.
UNCATEGORIZED = "uncategorized"


@dataclass(frozen=True)
class Capabilities:
    """What a run's episodes let the loop do, asked wherever it once asked which environment it trains: an
    environment declares its own on the class (`Environment.capabilities`); plug-ins keep the defaults, the gateway's
    live traffic of an agent that is no plug-in has no world and is judged by its users (environments/gateway)."""

    # Tasks and a world the loop can open: built by the `world` and `tasks` assets, rolled out in by GRPO, played
    # by validation. Without one there are only recorded episodes: GRPO is skipped and validation replays them.
    world: bool = True
    # Outcomes come from users' feedback, not from a judge of ours: curation judges by it (and may label what nobody
    # rated) and holds out rated-good episodes, which SFT never sees and validation replays.
    judged_by_users: bool = False
    # A chat agent whose reply in words is its answer (an OpenAI fine-tuning job's rows): a turn with no tool call
    # ends the episode with that text as its FinalAnswer instead of breaking the format, and the session may offer
    # no tools at all.
    answers_in_words: bool = False


def _every_correct_episode_teaches(reward: float) -> float:
    """Grading's default demonstration quality: the judge said correct, and that is all it says."""
    return 1.0


@dataclass(frozen=True)
class Grading:
    """What the loop's checks read of an environment's judging beyond each episode's Judgement, in one place (an
    environment returns its own from `Environment.grading()`; every field has a default a plug-in may keep)."""

    # Lowest and highest reward the judge gives: curation quarantines episodes outside it as corrupt.
    reward_range: tuple[float, float] = (-2.0, 1.5)
    # The reward above which the reward-hacking detectors count a rollout as rewarded (besides a correct one): 0 for
    # judges that reward only what they favour; a graded judge's pass threshold where every answer scores a little.
    rewarded_above: float = 0.0
    # How good a demonstration a correct episode with this reward is, in [0, 1]: SFT keeps the correct episodes at
    # or above curation's min_quality.
    demonstration_quality: Callable[[float], float] = _every_correct_episode_teaches
    # Reward-hacking detectors of the environment's own, run on its GRPO rollouts beside the loop's generic ones
    # (same answer everywhere, tool-call spam, format exploits): {kind: (rollouts, HackingConfig) -> Finding}.
    hacking_detectors: Mapping[str, Detector] = field(default_factory=dict)
    # General questions without tools for the forgetting gate (empty: the loop's default probe).
    probe: tuple[ProbeItem, ...] = ()

    def __post_init__(self) -> None:
        low, high = self.reward_range
        if not low < high:
            raise ValueError(f"Grading.reward_range must be (lowest, highest) with lowest < highest, got "
                             f"{self.reward_range}")
        object.__setattr__(self, "probe", tuple(self.probe))


# The members an environment defined before `Grading` held them: read from it, with a DeprecationWarning, for one
# release (methods are called, attributes read).
LEGACY_GRADING = ("reward_range", "rewarded_above", "demonstration_quality", "hacking_detectors", "probe")
# What the loop derives from a plug-in's session type rather than asks of it.
DERIVED_MEMBERS = ("tool_names", "tool_schemas")


@dataclass
class StoredWorld:
    """The anonymized world an environment's own `World.anonymize` wrote under a folder, as the loop opens it again."""

    environment: Environment  # reopened on that world: its tasks are the anonymized ones (GRPO rows, validation)
    store_url: str  # the store GRPO's training process rolls out in (staged for a pod like any other input)


class World:
    """Where an environment's tasks run, when the environment object does not carry it whole (the email assistant's
    mail store: built from a corpus, too large to copy): built before anything plays, anonymized whole with the
    week's episodes, reopened for GRPO and validation. `Environment.world()` returns it. Every default means "the
    world comes with the environment": no personal data declared, nothing to build, the loop's privacy pass, the saved
    copy reopened, the loop's GRPO rows and rollouts, every task replayable when served."""

    # True for a world that is a store of its own (the email assistant's), anonymized whole and rolled out in
    # alone, or none to share (the gateway's live traffic): a run that trains it trains nothing else.
    trains_alone: bool = False

    def __init__(self, environment: Environment | None = None) -> None:
        self.environment = environment  # whose world it is (None: a world of none, the gateway's)

    def replayable_tasks(self) -> list[Task]:
        """The tasks a served request may be judged against (a caller allowed to replay names one by id, with its
        prompt). Default: every task of every split of the environment."""
        if self.environment is None:
            return []
        return [task for split in Split for task in self.environment.tasks(split)]

    def contexts(self) -> frozenset[str]:
        """The contexts callers may ask about when served (a mailbox, a store); asked again when a caller names an
        unknown one, so a world that grows is served without a restart. Default: those of `replayable_tasks`."""
        return frozenset(task.context for task in self.replayable_tasks())

    def privacy(self) -> PrivacySpec:
        """Which of the world's data is personal (the people it knows, the names that are nobody's): curation's
        anonymizer reads it. Default: none declared (episodes are anonymized all the same)."""
        return PrivacySpec()

    def anonymized(self, transform: Callable[[str], str]) -> Environment | None:
        """The environment on a copy of this world (a customer database, its tasks) whose personal values went
        through `transform`, curation's pseudonymizer: the same function rewrites the episodes, so an anonymized task
        still plays to the same outcome. None: the world holds no personal data and stays as it is."""
        return None

    def holds_personal_data(self) -> bool:
        """Whether curation rewrites the world and tasks too (people declared, or an `anonymized` of its own), not
        only the episodes: pseudonymizing a timetable's station names would break it."""
        return self.privacy().known_people is not None or type(self).anonymized is not World.anonymized

    def build(self, **options: Any) -> dict[str, Any]:
        """Build the world the tasks run in (a store filled from a corpus) before anything plays in it; `options`
        are the run's world settings (a seed, a corpus to ingest), each taken by the worlds that use it. Returns
        what was built, for the run's metadata."""
        return {}

    def build_tasks(self, **options: Any) -> dict[str, Any]:
        """Write the tasks `Environment.tasks(split)` gives from the world `build` built (generated questions with
        their answers), with the same `options`; returns what was written, for the run's metadata."""
        return {}

    def anonymize(self, episodes: list[dict[str, Any]], out_dir: Path, canaries: list[str],
                  config: AnonymizerConfig) -> WorldPrivacy | None:
        """Curation's privacy pass run by the world itself, for one the loop cannot copy whole: anonymize the
        week's episodes with the world under one set of pseudonyms, audit both, write the anonymized world under
        `out_dir` and return the rest. None: the loop's pass (curation/plugin_privacy.py)."""
        return None

    def reopen(self, out_dir: Path) -> StoredWorld | None:
        """The anonymized world `anonymize` wrote under `out_dir` and the environment reopened on it, for GRPO and
        validation to play what curation left. None: the loop reopens the copy it saved (`environments.worlds`)."""
        return None

    def grpo_rows(self, tasks: list[Task]) -> list[dict[str, Any]] | None:
        """GRPO rows for `tasks` in the shape this world's own `rollout_factory` reads (its rollouts'
        `reset(**row)`). None: the loop's rows, each carrying its task (train/plugin_rollouts.task_rows)."""
        return None

    def rollout_factory(self, max_turns: int) -> Callable[[], Any] | None:
        """TRL's `environment_factory` for GRPO rollouts of this world's rows, if it has its own: objects with
        `reset(**row)`, the tools as public methods, and `_observe(completion)` giving an
        `agent_rl.environments.rollouts.JudgedRollout`. None: the loop's rollouts over `Environment.open`, judged
        by `Environment.judge` (train/plugin_rollouts.py)."""
        return None

    def teacher(self, **options: Any) -> Policy | None:
        """A policy that plays this world's tasks well, seeding the pool before any model of ours is trained (the
        `teacher:NAME` policy spec; `options` are the spec's JSON, e.g. a simulated success rate). Default: none."""
        legacy = _legacy_member(self.environment, "teacher")
        return legacy(**options) if legacy else None

    def close(self) -> None:
        """Release what the world opened for the sessions (a database connection); the loop calls it, through
        `Environment.close()`, when it is done playing. Default: nothing to release."""
        legacy = _legacy_member(self.environment, "close")
        if legacy:
            legacy()


# Members an environment class defined itself before `World` took them; still honoured for one release.
LEGACY_ENVIRONMENT_MEMBERS = ("teacher", "close")


def _legacy_member(environment: Environment | None, name: str) -> Callable[..., Any] | None:
    """The environment's own `teacher` or `close` of a plug-in written before they moved into `World`, bound."""
    legacy = getattr(type(environment), f"_legacy_{name}", None) if environment is not None else None
    return legacy.__get__(environment) if legacy else None


# The hooks an environment class declared itself before `World` gathered them: World method -> the old name.
LEGACY_WORLD_HOOKS = {"privacy": "privacy", "anonymized": "anonymized", "build": "build_world",
                      "build_tasks": "build_tasks", "anonymize": "privacy_pass", "reopen": "stored_world",
                      "grpo_rows": "grpo_rows", "rollout_factory": "rollout_factory",
                      "replayable_tasks": "replayable_tasks", "contexts": "contexts"}


class _EnvironmentHooks(World):
    """The world of a plug-in written before `World`: each hook its environment defines (and `trains_alone`) called
    in place of World's own method, World's default where it defines none. Kept for one release."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.trains_alone = bool(getattr(environment, "trains_alone", False))

    def _hook(self, method: str) -> Callable[..., Any] | None:
        return getattr(self.environment, LEGACY_WORLD_HOOKS[method], None)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        hook = self._hook(method)
        return hook(*args, **kwargs) if hook else getattr(World, method)(self, *args, **kwargs)

    def privacy(self) -> PrivacySpec:
        return self._call("privacy")

    def anonymized(self, transform: Callable[[str], str]) -> Environment | None:
        return self._call("anonymized", transform)

    def holds_personal_data(self) -> bool:
        return self.privacy().known_people is not None or self._hook("anonymized") is not None

    def build(self, **options: Any) -> dict[str, Any]:
        return self._call("build", **options)

    def build_tasks(self, **options: Any) -> dict[str, Any]:
        return self._call("build_tasks", **options)

    def anonymize(self, episodes: list[dict[str, Any]], out_dir: Path, canaries: list[str],
                  config: AnonymizerConfig) -> WorldPrivacy | None:
        return self._call("anonymize", episodes, out_dir, canaries, config)

    def reopen(self, out_dir: Path) -> StoredWorld | None:
        return self._call("reopen", out_dir)

    def grpo_rows(self, tasks: list[Task]) -> list[dict[str, Any]] | None:
        return self._call("grpo_rows", tasks)

    def rollout_factory(self, max_turns: int) -> Callable[[], Any] | None:
        return self._call("rollout_factory", max_turns)

    def replayable_tasks(self) -> list[Task]:
        return self._call("replayable_tasks")

    def contexts(self) -> frozenset[str]:
        return self._call("contexts")


class EnvironmentError(RuntimeError):  # noqa: A001 - the loop's own error for a broken plug-in
    """A plug-in that breaks the contract; the message names the environment and what is wrong."""

    def __init__(self, environment: str, problem: str) -> None:
        super().__init__(f"environment {environment!r}: {problem}")
        self.environment, self.problem = environment, problem


class Environment(abc.ABC):
    """Subclass this (or wrap a TRL-style environment class with `trl_environment`)."""

    name: ClassVar[str] = ""
    categories: ClassVar[tuple[str, ...]] = ()
    system_prompt: ClassVar[str] = ""
    # What the loop may do with its episodes (a world to play in, a judge of ours, answers in words); the defaults
    # for a plug-in.
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "answers_in_words" in vars(cls):  # before Capabilities held it: kept for one release
            warnings.warn(f"{cls.__name__} sets answers_in_words on the class: declare it in capabilities "
                          f"(Capabilities(answers_in_words=True)); the class attribute goes in the next release",
                          DeprecationWarning, stacklevel=2)
            cls.capabilities = replace(cls.capabilities, answers_in_words=bool(vars(cls)["answers_in_words"]))
        moved = [name for name in LEGACY_ENVIRONMENT_MEMBERS if name in vars(cls)]
        if moved:  # World's now: the class's own kept under another name, which World's defaults call
            warnings.warn(f"{cls.__name__} defines {', '.join(moved)} on the environment: define it on a World "
                          f"returned by world() instead (the environment-level member goes in the next release)",
                          DeprecationWarning, stacklevel=2)
            for name in moved:
                setattr(cls, f"_legacy_{name}", vars(cls)[name])
                setattr(cls, name, getattr(Environment, name))
        derived = [name for name in DERIVED_MEMBERS if name in vars(cls)]
        if derived:  # overridden, the model would train on one set of tools and be served another
            warnings.warn(f"{cls.__name__} overrides {', '.join(derived)}: the tools are derived from session_type()'s "
                          f"public methods and their docstrings; the override goes in the next release",
                          DeprecationWarning, stacklevel=2)

    @abc.abstractmethod
    def tasks(self, split: Split) -> list[Task]:
        """The environment's tasks of one split (tests come from Split.TEST and are never trained on)."""

    @abc.abstractmethod
    def open(self, task: Task) -> Any:
        """A fresh tool session for one episode of `task`; its public methods are the tools."""

    @abc.abstractmethod
    def final_answer(self, session: Any) -> FinalAnswer | None:
        """What the session recorded as the end of the episode (None while the agent has not ended it)."""

    @abc.abstractmethod
    def judge(self, task: Task, session: Any, trajectory: Trajectory) -> Judgement:
        """The outcome and rubric of a finished episode; the one judging path of the loop."""

    def opening_messages(self, task: Task) -> list[dict[str, Any]]:
        """The messages that start an episode: instructions, then the user's request."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return messages + [{"role": "user", "content": task.prompt}]

    def session_type(self) -> type:
        """The class of the sessions `open` returns: its public methods are the tools."""
        raise NotImplementedError

    @final
    def tool_names(self) -> tuple[str, ...]:
        """The tools: the public methods of `session_type()`, in source order. Derived, not for overriding."""
        return public_methods(self.session_type())

    @final
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas of the tools, derived from their signatures and docstrings (what TRL
        renders for training, so serving shows the model the same). Derived, not for overriding."""
        return session_tool_schemas(self.session_type())

    def grading(self) -> Grading:
        """What the loop's checks read of this environment's judging (reward range, demonstration quality, its own
        reward-hacking detectors, the forgetting probe): see `Grading`. Default: Grading's defaults."""
        legacy = [name for name in LEGACY_GRADING if hasattr(type(self), name) or name in vars(self)]
        if not legacy:
            return Grading()
        warnings.warn(f"environment {self.name!r} defines {', '.join(legacy)} on the environment: return a Grading "
                      f"from grading() instead (the environment-level members go in the next release)",
                      DeprecationWarning, stacklevel=2)
        values = {name: getattr(self, name) for name in legacy}
        values.update({name: value() for name, value in values.items() if name in ("hacking_detectors", "probe")})
        return Grading(**values)

    def world(self) -> World:
        """Where the tasks run, when the environment does not carry it whole (a store built from a corpus, its own
        privacy pass, its own GRPO rows and rollouts): see `World`. Default: the world comes with the environment."""
        legacy = sorted(name for name in [*LEGACY_WORLD_HOOKS.values(), "trains_alone"] if hasattr(type(self), name))
        if legacy:
            warnings.warn(f"environment {self.name!r} defines {', '.join(legacy)} on the environment: return a "
                          f"World from world() instead (the environment-level hooks go in the next release)",
                          DeprecationWarning, stacklevel=2)
            return _EnvironmentHooks(self)
        return World(self)

    @final
    def teacher(self, **options: Any) -> Policy | None:
        """The world's teacher (`World.teacher`), asked of the environment for short. Not for overriding."""
        return self.world().teacher(**options)

    @final
    def close(self) -> None:
        """Release what the world opened (`World.close`); the loop calls it when it is done playing. Not for
        overriding."""
        self.world().close()


def public_methods(cls: type) -> tuple[str, ...]:
    """Names of the public methods of a session class, as TRL offers them (reset excluded), in source order."""
    names = []
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name == "reset" or name in names:
                continue
            if inspect.isfunction(value):
                names.append(name)
    return tuple(names)


_SCHEMA_CACHE: dict[type, list[dict[str, Any]]] = {}


def session_tool_schemas(cls: type) -> list[dict[str, Any]]:
    """Each tool's schema as transformers' `get_json_schema` (and so TRL) renders it; a method it cannot
    describe (missing type hints or docstring) is an EnvironmentError naming the method."""
    if cls not in _SCHEMA_CACHE:
        from transformers.utils import get_json_schema

        schemas = []
        for name in public_methods(cls):
            try:
                schemas.append(get_json_schema(getattr(cls, name)))
            except Exception as exc:
                raise EnvironmentError(cls.__name__, f"tool {name!r} cannot be described: {exc}") from None
        _SCHEMA_CACHE[cls] = schemas
    return copy_json(_SCHEMA_CACHE[cls])


def copy_json(value: Any) -> Any:
    """A copy of a JSON-like value whose dicts and lists are new (strings and numbers are immutable, so shared):
    several times cheaper than a json.dumps/loads round trip, which would re-encode every tool result of a
    conversation on every turn; callers may change the copy without corrupting a cache."""
    if isinstance(value, Mapping):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [copy_json(v) for v in value]
    return value


REQUIRED_METHODS = ("tasks", "open", "final_answer", "judge")


def answers_in_words(environment: Any) -> bool:
    """Whether `environment`'s agent may answer in words (its capabilities say so)."""
    capabilities = getattr(environment, "capabilities", None)
    return bool(getattr(capabilities, "answers_in_words", False))


def check_environment(environment: Any) -> Environment:
    """`environment` if it keeps the contract's shape, else an EnvironmentError saying what is missing."""
    label = getattr(environment, "name", "") or type(environment).__name__
    if not isinstance(label, str) or not label.strip():
        raise EnvironmentError(type(environment).__name__, "declares no name")
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(environment, m, None))]
    if missing:
        raise EnvironmentError(label, f"lacks method(s) {', '.join(missing)}")
    categories = getattr(environment, "categories", ())
    if not categories or not all(isinstance(c, str) and c for c in categories):
        raise EnvironmentError(label, "declares no task categories (a tuple of non-empty strings)")
    try:
        tools = environment.tool_names()
    except NotImplementedError:
        raise EnvironmentError(label, "does not say its session type (session_type())") from None
    if not tools and not answers_in_words(environment):
        raise EnvironmentError(label, "its session offers no tools (public methods) and it does not answer in words")
    try:
        environment.tool_schemas()
    except EnvironmentError as exc:  # raised naming the session class: name the environment instead
        raise EnvironmentError(label, exc.problem) from None
    return environment
