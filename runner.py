"""Shim until integration: the LM workload and its measurement now live in bench_e2e.py, build_model and
build_optimizer in model.py."""
from bench_e2e import (MIN_BLOCK_S, ONE_SAMPLE_NOTE, Prepared, RunConfig, Workload, allocated_bytes,  # noqa: F401
                       check_logits, compile_and_warm_up, measure, measure_interleaved, measure_steps, run_step,
                       sample_stats, samples_by_phase)
from model import STAFF_MODEL_KEYWORDS, USER_OPTIMIZER_LR, TransformerLM, build_model, build_optimizer  # noqa: F401
