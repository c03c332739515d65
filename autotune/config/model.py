"""The GPT being tuned: its dimensions, validated, plus named presets.

Field names match the ``model`` object of a trial spec (``docs/trainer.md``) so that
the same object is built from a study file and from a trial spec.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from autotune.config._fields import (
    check_choice,
    check_float,
    check_int,
    check_keys,
    check_text,
)
from autotune.errors import SpecError

__all__ = ["ModelConfig", "MODEL_PRESETS", "MLP_KINDS", "ATTENTION_KINDS"]

MLP_KINDS = ("gelu", "swiglu")
"""MLP kinds: GPT's ``fc2(gelu(fc1 x))`` and Llama's gated ``down(silu(gate x) * up x)``."""
ATTENTION_KINDS = ("flash", "explicit")
"""How attention is computed: fused (the ``s x s`` scores never reach device memory) or
explicit (the scores are written, soft-maxed and kept for the backward pass)."""
MAX_DIMENSIONS: dict[str, int] = {
    "n_layer": 10_000, "hidden": 1_000_000, "n_head": 100_000, "seq_len": 100_000_000,
    "vocab_size": 10_000_000, "ffn_hidden": 10_000_000, "n_kv_head": 100_000}
"""Upper bounds of the dimensions: far above any model trained (GPT-3 175B: 96 layers,
hidden 12,288, 96 heads), low enough that FLOPs and bytes stay finite floats."""


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only GPT (pre-LayerNorm, GELU or SwiGLU MLP, learned positions)."""

    n_layer: int
    """Transformer layers."""
    hidden: int
    """Hidden size h."""
    n_head: int
    """Attention heads a."""
    seq_len: int
    """Sequence length s (tokens per sequence)."""
    vocab_size: int = 51200
    """Vocabulary V (padded for TP by the trainer; FLOPs use this unpadded value)."""
    ffn_hidden: int | None = None
    """MLP inner size; ``None`` means ``4 * hidden``."""
    n_kv_head: int | None = None
    """Key/value heads for grouped-query attention; ``None`` means ``n_head``."""
    name: str = "custom"
    """A label for reports."""
    mlp: str = "gelu"
    """``"gelu"``: two matrices ``h x f`` and ``f x h`` with biases (GPT-2/3). ``"swiglu"``:
    the gated MLP of Llama and AuroraGPT (Shazeer 2020, "GLU Variants Improve
    Transformer"), three matrices (gate and up ``h x f``, down ``f x h``) and, as in Llama,
    no biases on them; ``ffn_hidden`` is then the gate/up width (e.g. 28672 for h = 8192)."""
    attention: str = "flash"
    """``"flash"``: fused attention that never stores the ``s x s`` score matrix (torch
    SDPA / FlashAttention, Dao et al. 2022; what the trainer runs by default and what
    current Megatron and DeepSpeed stacks use). ``"explicit"``: the scores are computed by
    a GEMM, soft-maxed and kept for the backward pass (Megatron's fused-softmax path
    before FlashAttention; e.g. the vTrain measurements). It changes memory (the
    ``5 a s / h`` term of Korthikanti et al. 2022) and time (memory-bound passes over the
    scores), so the models must know which one a job runs."""
    dropout: float = 0.0
    """Dropout probability of the runs described (Megatron's ``--attention-dropout`` and
    ``--hidden-dropout``: 0.1 in its defaults, 0 in most LLM recipes). With dropout the
    layers also keep its masks and, with explicit attention, the dropped-out scores
    (Korthikanti et al. 2022 count both); without, they do not. Every workload runs it: the
    built-in trainer drops out where Megatron does, seeded (``trainer/dropout.py``), and a
    Megatron-DeepSpeed trial or export passes it as both ``--hidden-dropout`` and
    ``--attention-dropout``."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "hidden", "n_head", "seq_len", "vocab_size"):
            check_int(f"model.{name}", getattr(self, name), maximum=MAX_DIMENSIONS[name])
        if self.ffn_hidden is not None:
            check_int("model.ffn_hidden", self.ffn_hidden, maximum=MAX_DIMENSIONS["ffn_hidden"])
        if self.n_kv_head is not None:
            check_int("model.n_kv_head", self.n_kv_head, maximum=MAX_DIMENSIONS["n_kv_head"])
            if self.n_head % self.n_kv_head:
                raise SpecError("model.n_kv_head", self.n_kv_head,
                                f"allowed: a divisor of n_head={self.n_head}")
        check_text("model.name", self.name, max_chars=100)
        check_choice("model.mlp", self.mlp, MLP_KINDS)
        check_choice("model.attention", self.attention, ATTENTION_KINDS)
        check_float("model.dropout", self.dropout)
        if self.dropout >= 1.0:
            raise SpecError("model.dropout", self.dropout, "allowed: a probability >= 0 and < 1")
        if self.hidden % self.n_head:
            raise SpecError("model.n_head", self.n_head,
                            f"allowed: a divisor of hidden={self.hidden}")

    @property
    def ffn(self) -> int:
        """The MLP inner size actually used."""
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used."""
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection: ``h`` of queries and ``kv_heads *
        head_dim`` each of keys and values (``h + 2 kv``; ``3 h`` without grouped-query
        attention)."""
        return self.hidden + 2 * self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of ``h x f`` in the MLP: 2 for GELU, 3 for SwiGLU."""
        return 3 if self.mlp == "swiglu" else 2

    def n_params(self) -> int:
        """Trainable parameters (embeddings untied from the output layer, as in the trainer)."""
        h, qkv, f = self.hidden, self.qkv_width, self.ffn
        mlp = (3 * h * f if self.mlp == "swiglu"   # gate, up, down; no biases (Llama)
               else h * f + f + f * h + h)         # up + bias, down + bias
        per_layer = (
            h * qkv + qkv                    # QKV weight + bias
            + h * h + h                      # attention output
            + mlp
            + 4 * h                          # two LayerNorms
        )
        embeddings = self.vocab_size * h + self.seq_len * h
        return self.n_layer * per_layer + embeddings + 2 * h + self.vocab_size * h

    def to_dict(self) -> dict[str, Any]:
        """The ``model`` object of a trial spec."""
        out = asdict(self)
        out["ffn_hidden"] = self.ffn
        return out

    @classmethod
    def from_dict(cls, data: Any, *, section: str = "model") -> ModelConfig:
        """From a mapping: either ``{preset: NAME, ...overrides}`` or explicit dimensions."""
        allowed = {"preset", "n_layer", "hidden", "n_head", "seq_len", "vocab_size",
                   "ffn_hidden", "n_kv_head", "name", "mlp", "attention", "dropout"}
        data = dict(check_keys(section, data, allowed))
        preset = data.pop("preset", None)
        try:
            if preset is not None:
                if not isinstance(preset, str) or preset not in MODEL_PRESETS:
                    raise SpecError(f"{section}.preset", preset,
                                    f"allowed: one of {', '.join(sorted(MODEL_PRESETS))}")
                return replace(MODEL_PRESETS[preset], **data)
            for req in ("n_layer", "hidden", "n_head", "seq_len"):
                if req not in data:
                    raise SpecError(f"{section}.{req}", None,
                                    "required (or give model.preset: one of "
                                    f"{', '.join(sorted(MODEL_PRESETS))})")
            return cls(**data)
        except SpecError as err:
            if section != "model" and err.field.startswith("model."):
                raise SpecError(section + err.field[5:], err.value, err.allowed) from None
            raise


MODEL_PRESETS: dict[str, ModelConfig] = {
    # CPU-sized: the README demo and the tests (seconds per step on 2 cores).
    "tiny": ModelConfig(n_layer=4, hidden=64, n_head=4, seq_len=64, vocab_size=256,
                        ffn_hidden=256, name="tiny"),
    # 20-50M parameters: the trainer-overhead benchmark on CPU.
    "small-30m": ModelConfig(n_layer=6, hidden=512, n_head=8, seq_len=256, vocab_size=8192,
                             name="small-30m"),
    # GPT-3 XL shape (Brown et al. 2020, table 2.1): the single-GPU MFU benchmark.
    "gpt-1.3b": ModelConfig(n_layer=24, hidden=2048, n_head=16, seq_len=2048, name="gpt-1.3b"),
    # The LRZ seed study's sizes (shapes as published for GPT-3-style models).
    "gpt-3.6b": ModelConfig(n_layer=30, hidden=3072, n_head=32, seq_len=2048, name="gpt-3.6b"),
    "gpt-18.4b": ModelConfig(n_layer=40, hidden=6144, n_head=48, seq_len=2048, name="gpt-18.4b"),
    "gpt-175b": ModelConfig(n_layer=96, hidden=12288, n_head=96, seq_len=2048, name="gpt-175b"),
}
