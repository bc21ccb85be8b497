"""The Transformer LM's configuration: ModelConfig, the model sizes of both handouts of the study (Table 1 of
the 2026 handout v26.1.1 and of Spring 2025), and the FLOPs formulas derived from a config.

gpt-fast keeps `ModelArgs` and `transformer_configs` at the top of its model.py; here they are a file of their own
so that what only reads configurations (report.py re-rendering a saved run, kernel_tables.py, --dry-run plans)
does not import torch. model.py builds the model from a ModelConfig.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from results import render_table

# ---- the configuration ----


class ConfigError(ValueError):
    """A configuration the user asked for cannot exist (unknown preset, bad shape, no such device): scripts turn
    it into a one-line usage error; any other exception is a bug and keeps its traceback."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the Transformer LM in model.py (the course's reference "basics" model)."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    context_length: int = 128  # longest sequence the RoPE cache covers
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.d_head % 2:
            raise ConfigError(f"d_model / num_heads = {self.d_head} must be even for RoPE (it rotates pairs)")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @property
    def matmul_params(self) -> int:
        """Parameters used as matmul weights: every Linear (attention, SwiGLU, lm_head); not the embedding
        lookup and not the RMSNorm gains."""
        per_layer = 4 * self.d_model * self.d_model + 3 * self.d_model * self.d_ff
        return self.num_layers * per_layer + self.d_model * self.vocab_size

    @property
    def block_params(self) -> int:
        """Parameters of one TransformerBlock: Q, K, V and output projections (4 d^2), the SwiGLU's three
        matrices (3 d d_ff) and the two RMSNorm gains (2 d). Its gradients are as many numbers again, in the
        parameters' dtype (fp32 master weights, also under autocast)."""
        return 4 * self.d_model * self.d_model + 3 * self.d_model * self.d_ff + 2 * self.d_model

    @property
    def num_params(self) -> int:
        """Exact parameter count of model.py's TransformerLM (untied embedding and lm_head)."""
        norms = (2 * self.num_layers + 1) * self.d_model
        return self.matmul_params + self.vocab_size * self.d_model + norms


# ---- the study's handouts ----
# The model sizes of the study's Table 1 (vocab 10,000) changed between the handout students worked from in
# Spring 2025 (the writeups people published) and the current one (assignment 2 v26.1.1, Spring 2026): the same
# name can mean a different model, so every script resolves names in one handout's table and says which.
# Rows shared by both handouts are written once and referenced by both dicts.

TINY = ModelConfig(d_model=512, d_ff=1344, num_layers=4, num_heads=16)  # the CPU size, not in Table 1
_SMALL = ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12)
_MEDIUM = ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16)
_LARGE = ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20)
_D2560 = ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32)  # 2026's xl = 2025's 2.7B

PRESETS_2026: dict[str, ModelConfig] = {
    "tiny": TINY, "small": _SMALL, "medium": _MEDIUM, "large": _LARGE, "xl": _D2560,
    "10B": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
}
PRESETS_2025: dict[str, ModelConfig] = {
    "tiny": TINY, "small": _SMALL, "medium": _MEDIUM, "large": _LARGE,
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25), "2.7B": _D2560,
}


@dataclass(frozen=True)
class Handout:
    """One handout of the study: its Table 1 and the setups its questions name."""

    name: str  # what --handout and CS336_HANDOUT take
    version: str  # how the course names it
    presets: dict[str, ModelConfig]  # Table 1 plus tiny
    default_context_length: int  # the benchmarking script's default sequence length
    memory_size: str  # memory_profiling: the size ...
    memory_contexts: tuple[int, ...]  # ... and its context lengths
    # gradient_checkpointing (b): (size, batch, context), or None where the handout has no such question
    checkpoint_setup: tuple[str, int, int] | None

    @property
    def table1(self) -> list[str]:
        """The sizes of the handout's Table 1 (what --size all runs): every preset but the CPU size."""
        return [name for name in self.presets if name != "tiny"]

    @property
    def title(self) -> str:
        return f"handout {self.name} ({self.version})"


HANDOUTS: dict[str, Handout] = {
    "2026": Handout("2026", "v26.1.1", PRESETS_2026, default_context_length=512, memory_size="xl",
                    memory_contexts=(128, 2048), checkpoint_setup=("xl", 4, 2048)),
    "2025": Handout("2025", "Spring 2025", PRESETS_2025, default_context_length=128, memory_size="2.7B",
                    memory_contexts=(128, 256, 512), checkpoint_setup=None),
}
DEFAULT_HANDOUT = "2026"  # the current handout
HANDOUT_ENV = "CS336_HANDOUT"  # set once in the shell instead of --handout on every command
DEFAULT_BATCH_SIZE = 4
# What one measured step of the LM does in each mode (runner.run_step runs them; reports name their columns after
# them): here, torch-free, so that the reports read them without the run path.
MODES = ("forward", "forward-backward", "train")
PHASES_BY_MODE = {"forward": ("forward",), "forward-backward": ("forward", "backward"),
                  "train": ("forward", "backward", "optimizer")}


def get_handout(name: str) -> Handout:
    if name not in HANDOUTS:
        raise ConfigError(f"unknown handout {name!r}; valid handouts: {', '.join(HANDOUTS)}")
    return HANDOUTS[name]


def get_config(name: str, handout: str = DEFAULT_HANDOUT, **overrides: Any) -> ModelConfig:
    """The preset called exactly `name` in `handout`'s table, at that handout's default context length, with
    any non-None overrides applied (and validated). A name only the other handout has says which one has it."""
    chosen = get_handout(handout)
    _check_preset(name, chosen)
    changes = {"context_length": chosen.default_context_length,
               **{k: v for k, v in overrides.items() if v is not None}}
    return dataclasses.replace(chosen.presets[name], **changes)


def _check_preset(name: str, handout: Handout, also_valid: tuple[str, ...] = ()) -> None:
    if name in handout.presets:
        return
    elsewhere = [h.name for h in HANDOUTS.values() if name in h.presets]
    if elsewhere:
        raise ConfigError(f"preset {name!r} is in handout {elsewhere[0]}'s table, not in handout {handout.name}'s "
                         f"({', '.join(handout.presets)}); use --handout {elsewhere[0]} "
                         f"(or {HANDOUT_ENV}={elsewhere[0]})")
    raise ConfigError(f"unknown preset {name!r}; valid presets in handout {handout.name}: "
                     f"{', '.join([*handout.presets, *also_valid])}")


def expand_sizes(names: list[str], handout: str) -> list[str]:
    """--size values with 'all' replaced by the handout's Table 1 (in order, no repeats), each checked
    (ConfigError naming the valid presets, or the handout that has the name)."""
    sizes: list[str] = []
    chosen = get_handout(handout)
    for name in names:
        if name != "all":
            _check_preset(name, chosen, also_valid=("all",))
        for size in chosen.table1 if name == "all" else [name]:
            if size not in sizes:
                sizes.append(size)
    return sizes


def model_tensor_shapes(cfg: ModelConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """The largest tensors a step of model.py builds, by name: the bounds check of check_tensor_sizes."""
    seq = cfg.context_length
    return {"logits": (batch, seq, cfg.vocab_size), "attention scores": (batch, cfg.num_heads, seq, seq),
            "embedding": (cfg.vocab_size, cfg.d_model), "feed-forward weight": (cfg.d_ff, cfg.d_model)}


def config_row(name: str, cfg: ModelConfig) -> dict[str, Any]:
    """One row describing a model config, as people quote it."""
    return {"size": name, "d_model": cfg.d_model, "d_ff": cfg.d_ff, "layers": cfg.num_layers,
            "heads": cfg.num_heads, "vocab": cfg.vocab_size, "params": cfg.num_params}


def config_table(models: list[tuple[str, ModelConfig]], handout: Handout, fmt: str = "github") -> str:
    """The model configurations of a run, one row per size (context lengths aside), under a line naming the
    handout whose table the names come from."""
    seen = dict.fromkeys((size, dataclasses.replace(cfg, context_length=1)) for size, cfg in models)
    rows = [config_row(size, cfg) for size, cfg in seen]
    for row in rows:
        row["params"] = f"{row['params']:,}"
    return (f"Model sizes from {handout.title}:\n\n"
            + render_table(rows, ["size", "d_model", "d_ff", "layers", "heads", "vocab", "params"], fmt))


# ---- FLOPs ----
# Counting convention: a multiply-add is 2 FLOPs, so (m x k) @ (k x n) costs 2*m*k*n (Kaplan et al. 2020,
# "Scaling Laws for Neural Language Models", Table 1; the same convention as torch.utils.flop_counter).


def attention_matmul_flops(batch: int, seq: int, d_model: int) -> int:
    """QK^T plus PV over all heads for one layer: 2 matmuls x 2*B*S*S*d_model. Full S x S, as the naive and the
    math kernels compute it (the causal half is masked, not skipped)."""
    return 2 * (2 * batch * seq * seq * d_model)


def forward_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """Forward pass: 2 x matmul parameters x tokens (every Linear, lm_head included; the embedding is a lookup)
    plus the attention score and value matmuls of every layer. Elementwise work (norms, softmax, RoPE, SwiGLU
    gating) is not counted: it is < 1% of the total at these shapes."""
    return 2 * cfg.matmul_params * batch * seq + cfg.num_layers * attention_matmul_flops(batch, seq, cfg.d_model)


def step_flops(cfg: ModelConfig, batch: int, seq: int, mode: str) -> int:
    """Forward only: forward FLOPs. With backward: 3x forward, since backward computes two matmuls (the gradient
    with respect to the input and to the weight) for every forward matmul. The AdamW update is elementwise and
    not counted."""
    return forward_flops(cfg, batch, seq) * (1 if mode == "forward" else 3)
