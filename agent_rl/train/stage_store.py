"""A training stage that shares nothing with the Dagster host: its files travel through a store both sides reach.

A pod sees neither the host's AGENT_RL_HOME nor its temp files. So the host uploads every input the stage config
names (SFT rows, GRPO prompts, saved worlds, the email world's database, the SFT or initial adapter, the base model when the
host has it) to an fsspec URL (`file://` on one machine or a shared volume, `s3://`, `gs://`) and hands the pod a
config of store URLs; the pod downloads them to scratch, trains, uploads its output directory and reports store
URLs; the host downloads that output into its own home and rewrites every path back (the result, the adapter
manifests). Objects are content-addressed (a hash of the bytes and the name), so a re-run uploads nothing it
already did, and an object counts only once its marker is written last: an interrupted upload is never read.

A pod may be preempted and started again elsewhere, with a fresh scratch. So every checkpoint the stage saves is
uploaded too, and a pointer written last (`checkpoints/<stage key>/latest.json`) names the newest; a pod that
starts on the same stage (the same config of content-addressed inputs and settings: the stage key) downloads that
checkpoint into its scratch first and the trainer resumes from it, as it would from its own folder on one machine.

Host: `StagedConfig.prepare(stage, config, store_url)`, then `.env_value` for the launch and `.bring_back(result)`.
Pod:  `read_stage_config(os.environ[CONFIG_ENV])`, then `run_in_scratch(config, run)` when it names a store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent_rl.jsonl import json_object

CONFIG_ENV = "AGENT_RL_STAGE_CONFIG"  # the stage config (JSON), or the store URL of it when too long for a variable
SCRATCH_ENV = "AGENT_RL_SCRATCH"  # where the pod downloads inputs and trains (default: the system temp dir)
STORE_KEY = "stage_store"  # the config key naming the store; its presence makes the entry point stage files
CONFIG_ENV_LIMIT = 64 * 1024  # Linux caps one variable at 128 KiB; a larger config travels as a store object
MARKER = ".complete"  # written last beside an object: its file list; no marker, no object
OBJECTS = "objects"
CHECKPOINTS = "checkpoints"  # <store>/checkpoints/<stage key>/latest.json: the newest checkpoint a pod uploaded

# Config keys that name files or directories the stage reads, with the URL prefix around the path (a SQLite URL).
INPUT_KEYS: dict[str, str] = {
    "model_path": "", "rows_jsonl": "", "init_adapter": "", "sft_adapter": "", "grpo_rows_jsonl": "",
    "environment_file": "", "environment_files": "", "store_url": "sqlite:///",
    "inbox_store_url": "sqlite:///",  # store_url's first name, in configs written before it
}
# May name the image's own copy of the base model or a hub name: passed on as given when this machine lacks it.
IMAGE_PATH_KEYS = ("model_path",)
# Files of an output directory that hold absolute paths (adapter stack, PEFT's base model), rewritten on arrival.
PATH_FILES = ("agent_rl_adapter.json", "adapter_config.json")


class StageStoreError(RuntimeError):
    """A store operation failed; the message names the store without its credentials."""


def shown_url(url: str) -> str:
    """The URL as it may appear in a message: no user, password or query string (tokens live there)."""
    if "://" not in url:
        return ("***@" + url.rsplit("@", 1)[1]) if "@" in url else url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    netloc = ("***@" if parts.username or parts.password else "") + host + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{netloc}{parts.path}" + ("?***" if parts.query else "")


def check_store_url(url: str, name: str = "stage_store_url") -> str:
    """The URL without a trailing slash, or a ValueError naming `name` and what is wrong (never the secret)."""
    import fsspec

    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if not parts.scheme or "://" not in url:
        raise ValueError(f"{name} {shown_url(url)!r}: expected an fsspec URL with a scheme (file:///abs/dir, "
                         "s3://bucket/dir)")
    if parts.password or parts.query:
        raise ValueError(f"{name} {shown_url(url)}: credentials in the URL would travel in the pod spec and the run's "
                         "metadata; give them to both sides through the environment (k8s_env_secret)")
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        raise ValueError(f"{name} {shown_url(url)}: a file URL needs an absolute path (file:///abs/dir)")
    try:
        fsspec.get_filesystem_class(parts.scheme)
    except ValueError:
        raise ValueError(f"{name} {shown_url(url)}: unknown protocol {parts.scheme!r} (fsspec knows file, s3, gs, "
                         "az, ...)") from None
    except ImportError as exc:
        raise ValueError(f"{name} {shown_url(url)}: protocol {parts.scheme!r} needs a package: {exc}") from None
    return url


def _files(path: Path, skip: Callable[[str], bool]) -> list[tuple[str, Path]]:
    """(relative name, file) of a file or of every file under a directory (links followed), sorted."""
    if path.is_file():
        return [(path.name, path)]
    found = []
    for folder, dirs, names in os.walk(path, followlinks=True):
        rel_dir = Path(folder).relative_to(path)
        dirs[:] = sorted(d for d in dirs if not skip((rel_dir / d).as_posix()))
        found.extend(((rel_dir / n).as_posix(), Path(folder) / n) for n in names if not skip((rel_dir / n).as_posix()))
    return sorted(found)


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def content_digest(path: Path, skip: Callable[[str], bool] = lambda _: False) -> str:
    """One hash over a file's or a directory's name, kind and bytes: the object's address in the store."""
    digest = hashlib.sha256(f"{'dir' if path.is_dir() else 'file'}\0{path.name}\0".encode())
    for rel, file in _files(path, skip):
        digest.update(f"{rel}\0{_sha256(file)}\n".encode())
    return digest.hexdigest()


class StageStore:
    """Content-addressed objects under one fsspec URL: `<url>/objects/<digest>/<name>` plus its marker."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = check_store_url(url)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url)
        except Exception as exc:  # noqa: BLE001 - any failure to open the store: say which, without its secrets
            raise StageStoreError(f"stage store {shown_url(self.url)}: cannot open it ({type(exc).__name__})") from None
        self.root = self.root.rstrip("/")

    def owns(self, url: object) -> bool:
        return isinstance(url, str) and url.startswith(f"{self.url}/{OBJECTS}/")

    def _path(self, url: str) -> str:
        if not self.owns(url):
            raise ValueError(f"{shown_url(url)} is not an object of the stage store {shown_url(self.url)}")
        return self.root + url[len(self.url):]

    def _marker(self, url: str) -> str:
        return self._path(url).rsplit("/", 1)[0] + "/" + MARKER

    def put(self, path: str | Path, skip: Callable[[str], bool] = lambda _: False) -> str:
        """Upload a file or directory (minus what `skip` names, by relative path); its URL. Present: no writes."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: nothing to upload to the stage store")
        url = f"{self.url}/{OBJECTS}/{content_digest(path, skip)}/{path.name}"
        marker = self._marker(url)
        if self._call("check", self.fs.exists, marker):
            return url
        files = _files(path, skip)
        target = self._path(url)
        for rel, file in files:
            remote = target if path.is_file() else f"{target}/{rel}"
            self._call("create a folder in", self.fs.makedirs, remote.rsplit("/", 1)[0], exist_ok=True)
            self._call("upload to", self.fs.put_file, str(file), remote)
        listing = {"kind": "dir" if path.is_dir() else "file", "files": [rel for rel, _ in files]}
        self._call("write to", self.fs.pipe_file, marker, json.dumps(listing).encode())
        return url

    def get(self, url: str, dest: str | Path) -> Path:
        """Download an object to `dest` (which must not exist): written beside it, then renamed into place."""
        dest = Path(dest)
        if dest.exists():
            raise FileExistsError(f"{dest} exists; the stage store downloads only to a new path")
        try:
            listing = json.loads(self._call("read", self.fs.cat_file, self._marker(url)))
        except FileNotFoundError:
            raise StageStoreError(f"{shown_url(url)}: not in the stage store (never uploaded, or interrupted)") \
                from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        incoming = dest.parent / f".{dest.name}.incoming-{uuid.uuid4().hex[:8]}"
        try:
            source = self._path(url)
            for rel in listing["files"]:
                local = incoming if listing["kind"] == "file" else incoming / rel
                local.parent.mkdir(parents=True, exist_ok=True)
                remote = source if listing["kind"] == "file" else f"{source}/{rel}"
                self._call("download from", self.fs.get_file, remote, str(local))
            if listing["kind"] == "dir":
                incoming.mkdir(exist_ok=True)  # an empty directory is still one
            incoming.rename(dest)
        finally:
            _remove(incoming)
        return dest

    def _pointer(self, key: str) -> str:
        return f"{self.root}/{CHECKPOINTS}/{key}/latest.json"

    def latest_checkpoint(self, key: str) -> dict[str, Any] | None:
        """The newest checkpoint uploaded for stage `key` ({"url", "name", "step"}), None when there is none."""
        try:
            pointer = json.loads(self._call("read", self.fs.cat_file, self._pointer(key)))
        except FileNotFoundError:
            return None
        except ValueError:
            raise StageStoreError(f"checkpoint pointer of stage {key} in {shown_url(self.url)} is not JSON") from None
        return pointer if isinstance(pointer, dict) and self.owns(pointer.get("url")) else None

    def record_checkpoint(self, key: str, out_dir: Path, step: int) -> str:
        """Upload the output folder as it stands at checkpoint `step` (that checkpoint, not the older ones, and
        what the run keeps beside them: its inputs marker, the prompts a GRPO filter kept, rollout records), then
        point stage `key` at it (the pointer last: a half upload is never named). Returns the snapshot's URL."""
        keep = f"checkpoint-{step}"
        url = self.put(out_dir, skip=lambda rel: skip_checkpoints(rel) and rel.split("/", 1)[0] != keep)
        self._call("create a folder in", self.fs.makedirs, self._pointer(key).rsplit("/", 1)[0], exist_ok=True)
        self._call("write to", self.fs.pipe_file, self._pointer(key),
                   json.dumps({"url": url, "name": keep, "step": step}).encode())
        return url

    def forget_checkpoints(self, key: str) -> None:
        """Drop stage `key`'s pointer once the stage has finished (its objects stay, content-addressed)."""
        try:
            self._call("remove from", self.fs.rm_file, self._pointer(key))
        except FileNotFoundError:
            pass

    def _call(self, what: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run one filesystem call; failures other than a missing file name the store, never its credentials."""
        try:
            return function(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - backends raise anything; the message must not carry secrets
            raise StageStoreError(f"could not {what} the stage store {shown_url(self.url)}: {type(exc).__name__}") \
                from None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def translate(value: Any, pairs: Iterable[tuple[str, str]]) -> Any:
    """`value` with every string equal to, or under, a `from` prefix rewritten to its `to` (longest prefix first)."""
    pairs = sorted(((a.rstrip("/"), b.rstrip("/")) for a, b in pairs if a), key=lambda p: -len(p[0]))
    if isinstance(value, dict):
        return {k: translate(v, pairs) for k, v in value.items()}
    if isinstance(value, list):
        return [translate(v, pairs) for v in value]
    if isinstance(value, str):
        for old, new in pairs:
            if value == old or value.startswith(old + "/"):
                return new + value[len(old):]
    return value


def check_pod_can_track(config: dict[str, Any]) -> None:
    """A pod cannot write this machine's MLflow files: a local tracking URI fails here, before anything uploads,
    instead of in the pod (or, worse, into a database in its scratch that nobody reads)."""
    uri = (config.get("tracking") or {}).get("uri")
    if isinstance(uri, str) and (uri.startswith(("sqlite:", "file:")) or "://" not in uri):
        kind = uri.split(":", 1)[0] if "://" in uri else "a path"
        raise ValueError(f"the stage's MLflow tracking URI is on this machine ({kind}); a pod cannot write it: set "
                         "MLFLOW_TRACKING_URI to a tracking server both reach (http://mlflow:5000)")


def _map_inputs(config: dict[str, Any], move: Callable[[str, str], str]) -> dict[str, Any]:
    """The config with each input value replaced by `move(key, inner)` (its prefix kept)."""
    out = dict(config)
    for key, prefix in INPUT_KEYS.items():
        value = config.get(key)
        if isinstance(value, str) and value.startswith(prefix):
            out[key] = prefix + move(key, value[len(prefix):])
        elif isinstance(value, list):
            out[key] = [prefix + move(key, v[len(prefix):]) if isinstance(v, str) and v.startswith(prefix) else v
                        for v in value]
    return out


def rewrite_path_files(folder: Path, pairs: list[tuple[str, str]]) -> None:
    """Translate the paths inside an output directory's manifests (temp file, then rename: never half-written)."""
    for name in PATH_FILES:
        for file in sorted(folder.rglob(name)):
            data = json.loads(file.read_text(encoding="utf-8"))
            fixed = translate(data, pairs)
            if fixed != data:
                temp = file.with_name(f".{file.name}.tmp-{uuid.uuid4().hex[:8]}")
                temp.write_text(json.dumps(fixed, indent=1), encoding="utf-8")
                temp.replace(file)


def sqlite_snapshot(path: Path, folder: Path) -> Path:
    """The database as one file: itself, or, while a write-ahead log holds commits beside it, a copy made with
    SQLite's backup API (the file alone would miss them)."""
    wal = path.with_name(path.name + "-wal")
    if not wal.is_file() or wal.stat().st_size == 0:
        return path
    import sqlite3

    copy = folder / path.name
    source, target = sqlite3.connect(f"file:{path}?mode=ro", uri=True), sqlite3.connect(copy)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return copy


def skip_checkpoints(rel: str) -> bool:
    """Checkpoints resume a run in the place it ran; the pod's scratch is gone afterwards, so they stay there."""
    return rel.split("/", 1)[0].startswith("checkpoint-")


@dataclass
class StagedConfig:
    """The host's side of one stage in the store: the config the pod gets, and how to bring its output home."""

    store: StageStore
    config: dict[str, Any]  # inputs as store URLs, no out_dir: what the pod gets
    out_dir: Path  # where the output lands on this machine
    to_host: list[tuple[str, str]] = field(default_factory=list)  # store URL -> this machine's path
    env_value: str = ""

    @classmethod
    def prepare(cls, stage: str, config: dict[str, Any], store_url: str,
                pod_values: dict[str, str] | None = None) -> StagedConfig:
        """Upload every input the config names; the config of store URLs, as the launch carries it.
        `pod_values`: inputs the pod has already (the base model baked into the image), passed as given."""
        if not config.get("out_dir"):
            raise ValueError(f"the {stage} config lacks out_dir")
        unknown = sorted(set(pod_values or {}) - set(INPUT_KEYS))
        if unknown:
            raise ValueError(f"pod_values names {', '.join(unknown)}, not inputs ({', '.join(INPUT_KEYS)})")
        store = StageStore(store_url)
        # The pod's own copies stand for this machine's in whatever the pod writes (manifests, the result).
        to_host = [(pod, str(config[key])) for key, pod in (pod_values or {}).items() if config.get(key)]
        config = {**config, **(pod_values or {})}

        def upload(key: str, value: str) -> str:
            path = Path(value)
            if not path.exists():
                if key in IMAGE_PATH_KEYS:
                    return value  # the image's own copy or a hub name: the pod resolves it
                raise FileNotFoundError(f"the {stage} config's {key} {value!r} does not exist on this machine")
            url = store.put(sqlite_snapshot(path, Path(snapshots)) if INPUT_KEYS[key].startswith("sqlite") else path)
            to_host.append((url, value))
            return url

        with tempfile.TemporaryDirectory(prefix="agent-rl-snapshot-") as snapshots:
            portable = {k: v for k, v in _map_inputs(config, upload).items() if k != "out_dir"}
        portable[STORE_KEY] = store.url
        staged = cls(store, portable, Path(config["out_dir"]).resolve(), to_host)
        staged.env_value = staged._config_text()
        return staged

    def _config_text(self) -> str:
        text = json.dumps(self.config)
        if len(text.encode()) <= CONFIG_ENV_LIMIT:
            return text
        with tempfile.TemporaryDirectory(prefix="agent-rl-config-") as folder:
            path = Path(folder) / "stage_config.json"
            path.write_text(text, encoding="utf-8")
            return self.store.put(path)

    def bring_back(self, result: dict[str, Any]) -> dict[str, Any]:
        """Download the pod's output into out_dir and rewrite the result's and the manifests' paths to this host's."""
        result = dict(result)
        out_url, pod_paths = result.pop("stage_out", None), result.pop("pod_paths", None) or {}
        if not self.store.owns(out_url):
            raise StageStoreError("the training stage reported no output in the stage store (stage_out)")
        to_host = [*self.to_host, (out_url, str(self.out_dir))]
        incoming = self.store.get(out_url, self.out_dir.parent / f".{self.out_dir.name}.out-{uuid.uuid4().hex[:8]}")
        try:
            pod_to_host = [(pod, translate(url, to_host)) for pod, url in pod_paths.items()]
            rewrite_path_files(incoming, [*pod_to_host, *to_host])
            _move_entries(incoming, self.out_dir)
        finally:
            _remove(incoming)
        return translate(result, to_host)


def _move_entries(source: Path, dest: Path) -> None:
    """Each entry of `source` replaces the one of that name in `dest` (renamed in whole, the old one removed after)."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        target = dest / entry.name
        old = dest / f".{entry.name}.old-{uuid.uuid4().hex[:8]}"
        if target.exists() or target.is_symlink():
            target.rename(old)
        entry.rename(target)
        _remove(old)


def read_stage_config(value: str) -> dict[str, Any]:
    """The stage config from CONFIG_ENV: JSON text, or the store URL of a JSON file (a config too long to inline)."""
    text = value.strip()
    if "://" in text and not text.startswith(("{", "[", '"')):
        import fsspec

        url = check_store_url(text, CONFIG_ENV)
        try:
            with fsspec.open(url, "rt", encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            raise StageStoreError(f"{CONFIG_ENV} names {shown_url(url)}, which does not exist") from None
    return json_object(text, CONFIG_ENV)


def stage_key(config: dict[str, Any]) -> str:
    """What identifies one stage across pod restarts: its config as the pod gets it (inputs are content-addressed
    store URLs, settings by value). The same key means the same inputs, so a checkpoint under it may be resumed.
    Where the stage reports (`tracking`: the MLflow server, the Dagster run) is not what it learns: a re-executed
    run, and the helper ranks of a multi-process stage (which report nothing), resume from the same checkpoint."""
    text = json.dumps({k: v for k, v in config.items() if k not in (STORE_KEY, "tracking")}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def checkpoint_uploader(store: StageStore, key: str, out_dir: Path):
    """A Trainer callback that uploads each checkpoint the trainer saves (process zero only) and points the stage's
    key at it, so a restarted pod resumes there. Built on demand: this module does not need transformers."""
    from transformers import TrainerCallback

    class CheckpointUploader(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = out_dir / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and (folder / "trainer_state.json").is_file():
                store.record_checkpoint(key, out_dir, state.global_step)
            return control

    return CheckpointUploader()


def _restore_checkpoint(store: StageStore, key: str, out_dir: Path) -> str | None:
    """Create out_dir: the output folder an earlier pod of this stage uploaded at its newest checkpoint, or empty.
    Returns the checkpoint's name (None: nothing to resume). The inputs marker then says the checkpoint may be
    adopted: the stage key already proved the inputs the same."""
    from agent_rl.train.sft import ADOPT_CHECKPOINTS, INPUTS_FILE

    pointer = store.latest_checkpoint(key)
    if pointer is None:
        out_dir.mkdir()
        return None
    store.get(pointer["url"], out_dir)
    (out_dir / INPUTS_FILE).write_text(ADOPT_CHECKPOINTS + "\n")
    return str(pointer.get("name"))


def run_in_scratch(config: dict[str, Any], run: Callable[[dict[str, Any], list], dict[str, Any]],
                   upload: bool = True) -> dict[str, Any]:
    """The pod's side: download the inputs to scratch, `run(local config, trainer callbacks)`, upload the output
    directory; the summary with store URLs in place of scratch paths, plus `stage_out` and `pod_paths` for the host.
    A checkpoint an earlier pod of the same stage uploaded is downloaded first (the run resumes from it), and each
    checkpoint this run saves is uploaded (the callbacks `run` must hand the trainer). The scratch folder is named
    by the stage key, so the inputs land on the same paths in every pod of the stage (the resume fingerprint reads
    them). `upload=False`: a helper process of a multi-process stage, whose rank 0 uploads and reports."""
    store = StageStore(config[STORE_KEY])
    key = stage_key(config)
    base = Path(os.environ.get(SCRATCH_ENV) or tempfile.gettempdir())
    scratch_dir = base / (f"agent-rl-stage-{key}" + ("" if upload else f"-rank{os.environ.get('RANK', 'x')}"))
    _remove(scratch_dir)  # an earlier pod's leftovers on this node: downloads are redone, never half-read
    scratch_dir.mkdir(parents=True)
    try:
        pod_paths: dict[str, str] = {}

        def download(_key: str, value: str) -> str:
            if not store.owns(value):
                return value  # an image path, a hub name or a database URL: used as given
            local = scratch_dir / "in" / value[len(store.url) + len(OBJECTS) + 2:]
            if not local.exists():
                store.get(value, local)
            pod_paths[str(local)] = value
            return str(local)

        local_config = {k: v for k, v in _map_inputs(config, download).items() if k != STORE_KEY}
        out_dir = scratch_dir / "out"
        local_config["out_dir"] = str(out_dir)
        _restore_checkpoint(store, key, out_dir)
        summary = run(local_config, [checkpoint_uploader(store, key, out_dir)] if upload else [])
        if not upload:
            return summary
        out_url = store.put(out_dir, skip=skip_checkpoints)
        store.forget_checkpoints(key)
        pod_paths[str(out_dir)] = out_url
        return {**translate(summary, pod_paths.items()), "stage_out": out_url, "pod_paths": pod_paths}
    finally:
        _remove(scratch_dir)
