from bench_attention import *  # noqa: F401,F403 - until integration: bench_attention holds it
