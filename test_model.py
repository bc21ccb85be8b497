"""model.py: parameter counts, FLOPs against torch's counter, state-dict names, reference equivalence, attention
variants, masking, RoPE."""
import math

import pytest
import torch
from einops import einsum, rearrange

from torch.utils.flop_counter import FlopCounterMode

import common
import results
from model import (HANDOUTS, ModelConfig, RotaryEmbedding, TransformerLM, cross_entropy, get_config, naive_attention,
                   sdpa_attention, step_flops)
from optim import AdamW

# (handout, size) -> parameters, worked out by hand from the handouts' Table 1 (vocab 10,000, untied lm_head)
EXPECTED_PARAMS = {("2026", "tiny"): 22_696_448, ("2026", "small"): 128_625_408, ("2026", "medium"): 423_183_360,
                   ("2026", "large"): 969_411_840, ("2026", "xl"): 3_406_809_600, ("2026", "10B"): 12_832_823_808,
                   ("2025", "tiny"): 22_696_448, ("2025", "small"): 128_625_408, ("2025", "medium"): 423_183_360,
                   ("2025", "large"): 969_411_840, ("2025", "xl"): 1_998_235_200, ("2025", "2.7B"): 3_406_809_600}
SMALL = ModelConfig(d_model=64, d_ff=96, num_layers=2, num_heads=4, vocab_size=100, context_length=32)


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("handout,name", list(EXPECTED_PARAMS))
def test_parameter_counts_on_meta_device(handout, name):
    with torch.device("meta"):
        model = TransformerLM(get_config(name, handout))
    assert count_params(model) == EXPECTED_PARAMS[handout, name]
    assert HANDOUTS[handout].presets[name].num_params == EXPECTED_PARAMS[handout, name]
    # the gradient memory per TransformerBlock (memory_profiling (f)) counts exactly one block's parameters
    assert count_params(model.layers[0]) == HANDOUTS[handout].presets[name].block_params
    # the counted shapes (what the memory predictions shard), in named_parameters order
    assert [tuple(p.shape) for p in model.parameters()] == HANDOUTS[handout].presets[name].parameter_shapes


def test_every_preset_of_both_handouts_has_an_expected_count():
    assert {(h, name) for h, handout in HANDOUTS.items() for name in handout.presets} == set(EXPECTED_PARAMS)


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_flops_formula_equals_torchs_flop_counter(mode):
    """Every matmul counted at 2 FLOPs per multiply-add, as torch.utils.flop_counter counts them: the formula is
    exact for our model (elementwise work is in neither)."""
    model, tokens = TransformerLM(SMALL), torch.randint(0, SMALL.vocab_size, (2, 24))
    with FlopCounterMode(display=False) as counter:
        logits = model(tokens)
        if mode == "train":
            cross_entropy(logits, tokens).backward()
    assert counter.get_total_flops() == step_flops(SMALL, 2, 24, mode)


@pytest.mark.parametrize("attn", ["naive", "sdpa"])
def test_byte_model_is_a_lower_bound_on_what_autograd_keeps(attn):
    """The floors' activations (results.saved_activations, written by forward, read by backward) are no more than
    what autograd saves for the step's backward, weights aside; naive's probabilities are what SDPA saves less."""
    model, tokens = TransformerLM(SMALL, attn=attn), torch.randint(0, SMALL.vocab_size, (2, 32))
    weights = {common.storage_key(p) for p in model.parameters()}
    with common.saved_tensors(exclude=weights) as saved:
        loss = cross_entropy(model(tokens), tokens)
        kept = sum(saved.values())
    counted = 4 * results.saved_activations(SMALL, 2, 32, attn)
    assert counted <= kept < 4 * counted  # a bound, and not a loose one
    assert results.forward_bytes(SMALL, 2, 32, 4, attn) == 4 * SMALL.matmul_params + counted
    loss.backward()
    assert results.backward_bytes(SMALL, 2, 32, 4, attn) - results.forward_bytes(SMALL, 2, 32, 4, attn) == sum(
        p.grad.nbytes for p in model.parameters())  # every fp32 gradient written once
    probabilities = 4 * 2 * SMALL.num_layers * SMALL.num_heads * 32 * 32
    assert results.saved_activations(SMALL, 2, 32, "naive") * 4 - counted == (probabilities if attn == "sdpa" else 0)


@pytest.mark.parametrize("make", [AdamW, torch.optim.AdamW])
def test_adamw_floor_is_28_bytes_per_parameter_over_the_bandwidth(make):
    """The tensors one AdamW step reads (parameters, gradients, both moments) and writes (parameters, moments), as
    the optimizer keeps them, against the floor's 28 bytes per fp32 parameter."""
    model, tokens = TransformerLM(SMALL), torch.randint(0, SMALL.vocab_size, (2, 8))
    optimizer = make(model.parameters())
    cross_entropy(model(tokens), tokens).backward()
    optimizer.step()
    params = list(model.parameters())
    moments = [optimizer.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
    read = sum(p.nbytes + p.grad.nbytes for p in params) + sum(m.nbytes for m in moments)
    written = sum(p.nbytes for p in params) + sum(m.nbytes for m in moments)
    assert results.optimizer_bytes(SMALL.num_params) == read + written == 28 * SMALL.num_params
    floors = results.step_floors(SMALL, 2, 8, "train", 4, "naive", tflops=1.0, gbs=100.0)
    assert floors["optimizer"]["floor_ms"] == pytest.approx((read + written) / 100e9 * 1e3)
    assert floors["optimizer"]["bound"] == "memory" and floors["optimizer"]["flops"] == 0


def test_a_collectives_floor_is_its_ring_bytes_over_the_link():
    # 1 GB all-reduced over 8 ranks on 450 GB/s links: each rank sends and receives 2 x 7/8 GB
    assert results.collective_floor_ms("all_reduce", 10**9, 8, 450.0) == pytest.approx(1.75 / 450 * 1e3)
    assert results.collective_floor_ms("all_gather", 10**9, 2, 100.0) == pytest.approx(5.0)
    assert results.collective_floor_ms("reduce_scatter", 10**9, 1, 100.0) == 0.0  # one rank: nothing moves


def test_state_dict_keys_are_the_reference_names():
    model = TransformerLM(SMALL)
    expected = {"token_embeddings.weight", "ln_final.weight", "lm_head.weight"}
    for i in range(SMALL.num_layers):
        expected |= {f"layers.{i}.attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "output_proj")}
        expected |= {f"layers.{i}.ffn.{w}.weight" for w in ("w1", "w2", "w3")}
        expected |= {f"layers.{i}.ln1.weight", f"layers.{i}.ln2.weight"}
    state = model.state_dict()
    assert set(state) == expected
    assert state["layers.0.ffn.w1.weight"].shape == (SMALL.d_ff, SMALL.d_model)  # (d_out, d_in)
    assert state["lm_head.weight"].shape == (SMALL.vocab_size, SMALL.d_model)


def reference_logits(state: dict, cfg: ModelConfig, tokens: torch.Tensor) -> torch.Tensor:
    """The course's reference model, transcribed as a function of its state dict (einsum linears, RoPE cache
    built as theta ** -(arange(0, d, 2) / d), pairs split with '(half_d xy) -> xy ... half_d', mask by
    torch.where, max-subtracted softmax)."""
    def linear(x, w):
        return einsum(x, w, "... d_in, d_out d_in -> ... d_out")

    def rmsnorm(x, g):
        xf = x.to(torch.float32)
        return (g * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5))).to(x.dtype)

    d_head = cfg.d_model // cfg.num_heads
    freqs = einsum(torch.arange(cfg.context_length), torch.tensor(cfg.rope_theta) ** -(torch.arange(0, d_head, 2) / d_head),
                   "t, f -> t f")
    seq = tokens.shape[-1]
    cos, sin = torch.cos(freqs)[:seq], torch.sin(freqs)[:seq]

    def rope(x):
        x1, x2 = rearrange(x, "... (half_d xy) -> xy ... half_d", xy=2).unbind(0)
        return rearrange(torch.stack((cos * x1 - sin * x2, sin * x1 + cos * x2)), "xy ... h -> ... (h xy)")

    x = state["token_embeddings.weight"][tokens]
    mask = torch.arange(seq)[:, None] >= torch.arange(seq)[None, :]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        h = rmsnorm(x, state[p + "ln1.weight"])
        q, k, v = (rearrange(linear(h, state[p + f"attn.{n}_proj.weight"]), "... s (h d) -> ... h s d", h=cfg.num_heads)
                   for n in "qkv")
        q, k = rope(q), rope(k)
        scores = torch.where(mask, einsum(q, k, "... q d, ... k d -> ... q k") / math.sqrt(d_head), float("-inf"))
        weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
        weights = weights / weights.sum(-1, keepdim=True)
        attn = rearrange(einsum(weights, v, "... q k, ... k d -> ... q d"), "b h s d -> b s (h d)")
        x = x + linear(attn, state[p + "attn.output_proj.weight"])
        h = rmsnorm(x, state[p + "ln2.weight"])
        a = linear(h, state[p + "ffn.w1.weight"])
        x = x + linear(a * torch.sigmoid(a) * linear(h, state[p + "ffn.w3.weight"]), state[p + "ffn.w2.weight"])
    return linear(rmsnorm(x, state["ln_final.weight"]), state["lm_head.weight"])


def test_reference_state_dict_loads_strictly_and_gives_the_same_logits():
    torch.manual_seed(0)
    donor = TransformerLM(SMALL)
    # a state dict as the reference saves it: plain tensors under the reference names, no RoPE buffer
    state = {k: torch.randn_like(v) * 0.1 + (1.0 if k.endswith("ln1.weight") else 0.0) for k, v in donor.state_dict().items()}
    model = TransformerLM(SMALL)
    model.load_state_dict(state, strict=True)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference_logits(state, SMALL, tokens), atol=1e-5, rtol=1e-5)


def test_naive_and_sdpa_agree_on_outputs_and_gradients():
    torch.manual_seed(0)
    model = TransformerLM(SMALL, attn="naive")
    tokens = torch.randint(0, SMALL.vocab_size, (2, 24))
    loss_naive = cross_entropy(model(tokens), tokens)
    loss_naive.backward()
    grads_naive = {n: p.grad.clone() for n, p in model.named_parameters()}
    sdpa = TransformerLM(SMALL, attn="sdpa")
    sdpa.load_state_dict(model.state_dict())  # the same weights, the other attention
    loss_sdpa = cross_entropy(sdpa(tokens), tokens)
    loss_sdpa.backward()
    torch.testing.assert_close(loss_sdpa, loss_naive, atol=1e-5, rtol=1e-5)
    for n, p in sdpa.named_parameters():
        torch.testing.assert_close(p.grad, grads_naive[n], atol=1e-5, rtol=1e-4)


def test_attention_functions_agree_with_heads_and_without():
    torch.manual_seed(0)
    for shape in [(2, 3, 17, 8), (4, 33, 16)]:
        q, k, v = (torch.randn(shape) for _ in range(3))
        torch.testing.assert_close(naive_attention(q, k, v), sdpa_attention(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["naive", "sdpa"])
def test_causal_mask_future_tokens_do_not_change_earlier_logits(attn):
    torch.manual_seed(0)
    model = TransformerLM(SMALL, attn=attn).eval()
    tokens = torch.randint(0, SMALL.vocab_size, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % SMALL.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_rope_preserves_norms_and_depends_on_position():
    rope = RotaryEmbedding(context_length=32, d_head=16)
    x = torch.randn(2, 32, 16)
    y = rope(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    same = x[:, :1].expand(2, 32, 16)  # one vector at every position
    rotated = rope(same)
    assert not torch.allclose(rotated[:, 0], rotated[:, 5])
    torch.testing.assert_close(rotated[:, 0], same[:, 0])  # position 0 is the identity rotation
    # relative: <R_m q, R_n k> depends only on m - n
    q, k = torch.randn(16), torch.randn(16)
    rq, rk = rope(q.expand(32, 16)), rope(k.expand(32, 16))
    torch.testing.assert_close(rq[7] @ rk[3], rq[14] @ rk[10], atol=1e-5, rtol=1e-5)


def test_rope_rotates_adjacent_pairs():
    rope = RotaryEmbedding(context_length=4, d_head=4)
    x = torch.zeros(2, 4)
    x[1, 0] = 1.0  # position 1, first pair = (1, 0): rotated by angle 1 rad within dims (0, 1)
    y = rope(x)
    torch.testing.assert_close(y[1], torch.tensor([math.cos(1.0), math.sin(1.0), 0.0, 0.0]))


def test_cross_entropy_is_stable_and_matches_torch():
    logits = torch.randn(3, 5, 11) * 1000  # large logits: a naive exp would overflow
    targets = torch.randint(0, 11, (3, 5))
    ours = cross_entropy(logits, targets)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def test_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = TransformerLM(SMALL)
    ckpt = TransformerLM(SMALL, checkpoint_every=1)
    ckpt.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, SMALL.vocab_size, (2, 16))
    for m in (plain, ckpt):
        cross_entropy(m(tokens), tokens).backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=n)


def test_rmsnorm_keeps_input_dtype_under_autocast():
    model = TransformerLM(SMALL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, SMALL.vocab_size, (1, 8)))
    assert logits.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32  # master weights stay fp32


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        ModelConfig(d_model=100, d_ff=64, num_layers=1, num_heads=3)
    with pytest.raises(ValueError, match="unknown preset 'huge'.*tiny"):
        get_config("huge")
    with pytest.raises(ValueError, match="num_layers must be a positive"):
        get_config("tiny", num_layers=0)
    with pytest.raises(ValueError, match="unknown attention"):
        TransformerLM(SMALL, attn="flash")
    with pytest.raises(ValueError, match="exceeds the model's context_length"):
        TransformerLM(SMALL)(torch.zeros(1, SMALL.context_length + 1, dtype=torch.long))
