"""The ONNX runtime: a sentence-transformers model without torch (onnxruntime, tokenizers, numpy).

It reproduces a plain model — Transformer → Pooling (cls, max, mean or
mean-sqrt-len) → optional Normalize — exactly: the model's own ``tokenizer.json``
(its max length, no truncation needed for the pieces the embedder cuts), the
exported transformer run by onnxruntime on the CPU, pooling and normalisation
in numpy.  :func:`describe_folder` says whether a folder is such a model; any
other (a Dense layer, custom modules or code, prompts, truncated dimensions, a
slow tokenizer) is run by torch instead, and ``memory-stats`` says why
(adr/0012).  The exported file itself comes from ``onnx_export.py``.

A one-shot process imports, loads and embeds a query in ~0.25 s here, against
~6 s for torch: ``import onnxruntime`` costs ~30 ms, the session ~60 ms
(the weights are memory-mapped from ``model.onnx.data``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .pooling import pool

# modules.json "type" strings this runtime reproduces exactly (older and sentence-transformers 6 spellings).
TRANSFORMER_TYPES = frozenset((
    "sentence_transformers.models.Transformer", "sentence_transformers.models.transformer.Transformer",
    "sentence_transformers.base.modules.transformer.Transformer", "sentence_transformers.base.modules.Transformer",
))
POOLING_TYPES = frozenset((
    "sentence_transformers.models.Pooling", "sentence_transformers.models.pooling.Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "sentence_transformers.sentence_transformer.modules.Pooling",
))
NORMALIZE_TYPES = frozenset((
    "sentence_transformers.models.Normalize", "sentence_transformers.models.normalize.Normalize",
    "sentence_transformers.base.modules.normalize.Normalize", "sentence_transformers.base.modules.Normalize",
))
LEGACY_POOLING_FLAGS = (  # in the order sentence-transformers concatenates them
    ("pooling_mode_cls_token", "cls"), ("pooling_mode_max_tokens", "max"), ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"), ("pooling_mode_lasttoken", "lasttoken"),
)
SUPPORTED_POOLING = frozenset(("cls", "max", "mean", "mean_sqrt_len_tokens"))
SB_KEYS = frozenset(("max_seq_length", "do_lower_case", "transformer_task", "modality_config", "module_output_name"))
DEFAULT_MODALITY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}


class Unsupported(Exception):
    """The folder holds something the ONNX runtime cannot reproduce exactly (the message says what)."""


def _json(path: Path, default: Any = None) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise Unsupported(f"{path.name} cannot be read: {exc}") from None


def describe_folder(folder: Path) -> dict[str, Any]:
    """What the ONNX runtime needs to know of a sentence-transformers folder, or :class:`Unsupported`.

    The checks run in this order, the first that fails saying why: the modules, the pooling, the
    sentence-transformers settings, the transformer's own config and its tokenizer."""
    pooling_path, normalize = _modules(folder)
    modes = _pooling_modes(_json(folder / pooling_path / "config.json", {}))
    sb = _sentence_transformers_settings(folder)
    hf = _json(folder / "config.json", {})
    if hf.get("auto_map"):
        raise Unsupported("config.json names custom modelling code (auto_map)")
    if not (folder / "tokenizer.json").is_file():
        raise Unsupported("no tokenizer.json (a slow tokenizer only)")
    tokenizer_config = _json(folder / "tokenizer_config.json", {})
    max_len = sb.get("max_seq_length") or tokenizer_config.get("model_max_length") or 512
    if hf.get("max_position_embeddings"):
        max_len = min(int(max_len), int(hf["max_position_embeddings"]))
    return {"modes": modes, "normalize": normalize, "max_seq_length": int(min(max_len, 8192)),
            "tokenizer_config": tokenizer_config}


def _modules(folder: Path) -> tuple[str, bool]:
    """The Pooling module's folder and whether a Normalize module follows it: the modules must be
    a plain Transformer, a Pooling module and at most one Normalize."""
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list) or not modules:
        raise Unsupported("the folder has no modules.json")
    ordered = sorted(modules, key=lambda m: m.get("idx", 0))
    if ordered[0].get("type") not in TRANSFORMER_TYPES or (ordered[0].get("path") or "") != "":
        raise Unsupported(f"its first module is not a plain Transformer: {ordered[0].get('type')}")
    if len(ordered) < 2 or ordered[1].get("type") not in POOLING_TYPES:
        raise Unsupported("its second module is not a Pooling module")
    rest = ordered[2:]
    foreign = [m for m in rest if m.get("type") not in NORMALIZE_TYPES]  # Dense, LayerNorm, Router, custom code
    if foreign:
        raise Unsupported(f"module {foreign[0].get('type')} ({foreign[0].get('path')!r}) is not reproduced by ONNX")
    if len(rest) > 1:
        raise Unsupported("more than one Normalize module")
    return ordered[1].get("path") or "", bool(rest)


def _pooling_modes(pooling: dict[str, Any]) -> list[str]:
    """The pooling modes a Pooling module's config names, if ONNX reproduces them all."""
    if "pooling_mode" in pooling:
        modes = pooling["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [mode for key, mode in LEGACY_POOLING_FLAGS if pooling.get(key)] or ["mean"]
    bad = [m for m in modes if m not in SUPPORTED_POOLING]
    if bad:
        raise Unsupported(f"pooling mode(s) {bad} are not reproduced by ONNX")
    if pooling.get("include_prompt") is False:
        raise Unsupported("pooling excludes the prompt")
    return modes


def _sentence_transformers_settings(folder: Path) -> dict[str, Any]:
    """``sentence_bert_config.json``, once it and ``config_sentence_transformers.json`` ask for
    nothing ONNX does not reproduce (prompts, truncated dimensions, lower-casing, other tasks)."""
    st = _json(folder / "config_sentence_transformers.json", {})
    if st.get("default_prompt_name") or st.get("truncate_dim"):
        raise Unsupported("the model applies a prompt or truncates its dimension")
    if st.get("model_type") not in (None, "SentenceTransformer"):
        raise Unsupported(f"model_type {st.get('model_type')!r}")
    sb: dict[str, Any] = _json(folder / "sentence_bert_config.json", {})
    if sb.get("do_lower_case"):
        raise Unsupported("sentence-transformers lower-cases the text itself (do_lower_case)")
    extra = sorted(set(sb) - SB_KEYS)
    if extra:
        raise Unsupported(f"sentence_bert_config.json sets {extra}, which ONNX does not reproduce")
    if (sb.get("transformer_task", "feature-extraction") != "feature-extraction"
            or sb.get("modality_config", DEFAULT_MODALITY) != DEFAULT_MODALITY
            or sb.get("module_output_name", "token_embeddings") != "token_embeddings"):
        raise Unsupported("the Transformer module is configured in a way ONNX does not reproduce")
    return sb


def default_threads() -> int:
    """onnxruntime threads: the cores this process may use, at most 2, never spinning (adr/0012)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


class OnnxRuntime:
    """Runs an exported model (``model.onnx`` + ``model.onnx.data``) for the folder it came from."""

    name = "onnx"
    device = "cpu"

    def __init__(self, folder: Path, onnx_path: Path, *, batch_size: int = 32, threads: int | None = None):
        self.folder = folder
        self.onnx_path = onnx_path
        self.batch_size = batch_size
        self.threads = threads or default_threads()
        self.window = 0
        self.dim = 0
        self.session: Any = None

    def load(self) -> None:
        if self.session is not None:
            return
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import onnxruntime as ort
        from tokenizers import Tokenizer

        info = describe_folder(self.folder)
        self.modes: list[str] = info["modes"]
        self.max_len: int = info["max_seq_length"]
        self._json_text = (self.folder / "tokenizer.json").read_text(encoding="utf-8")
        tok = Tokenizer.from_str(self._json_text)
        padding = tok.padding or {}
        tok.no_truncation()  # the file may carry its own truncation and fixed padding (MiniLM: 128)
        tok.no_padding()
        tcfg = info["tokenizer_config"]
        pad_token = tcfg.get("pad_token")
        if isinstance(pad_token, dict):
            pad_token = pad_token.get("content")
        pad_id = tok.token_to_id(pad_token or padding.get("pad_token") or "[PAD]")
        self.pad_id = int(pad_id if pad_id is not None else padding.get("pad_id", 0))
        self.pad_type_id = int(tcfg.get("pad_token_type_id", padding.get("pad_type_id", 0)) or 0)
        self.pad_left = tcfg.get("padding_side", "right") == "left"
        self.truncation_side = tcfg.get("truncation_side", "right")
        self.tok = tok
        self._truncating: Any = None
        self.window = max(16, self.max_len - tok.num_special_tokens_to_add(False))
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning worker threads burn the cores other processes need on a small shared machine.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        options.enable_cpu_mem_arena = False  # a long-lived process gives big batches' buffers back
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        width = self.session.get_outputs()[0].shape[-1]
        self.dim = int(width) * len(self.modes) if isinstance(width, int) else 0

    def token_starts(self, texts: list[str]) -> list[list[int]]:
        """The character offset where each token of each text starts (no special tokens)."""
        self.load()
        return [[s for s, _ in e.offsets] for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def _truncated(self, texts: list[str]) -> list[Any]:
        """Encodings cut like sentence-transformers cuts them (never needed for the embedder's pieces)."""
        if self._truncating is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(self._json_text)
            tok.no_padding()
            tok.enable_truncation(self.max_len, stride=0, strategy="longest_first", direction=self.truncation_side)
            self._truncating = tok
        return list(self._truncating.encode_batch(texts))

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of ``texts``: batches of similar lengths, each padded to its longest text."""
        self.load()
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = list(self.tok.encode_batch(texts))
        long = [i for i, e in enumerate(encodings) if len(e.ids) > self.max_len]
        for i, e in zip(long, self._truncated([texts[i] for i in long]) if long else []):
            encodings[i] = e
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        for start in range(0, len(texts), self.batch_size):
            rows = order[start: start + self.batch_size]
            batch = [encodings[j] for j in rows]
            width = max(len(e.ids) for e in batch)
            ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            types = np.full((len(batch), width), self.pad_type_id, dtype=np.int64)
            for r, e in enumerate(batch):
                span = slice(width - len(e.ids), width) if self.pad_left else slice(0, len(e.ids))
                ids[r, span], mask[r, span], types[r, span] = e.ids, e.attention_mask, e.type_ids
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feeds["token_type_ids"] = types
            hidden = self.session.run(None, feeds)[0]
            vectors = pool(hidden, mask, self.modes)
            out[rows] = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
        return out
