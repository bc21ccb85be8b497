"""optim.AdamW against torch.optim.AdamW, state round trips, parameters without gradients."""
import copy

import pytest
import torch

from optim import AdamW


def make_problem(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    data = torch.randn(64, 8), torch.randn(64, 4)
    return model, data


def train(model, opt, data, steps):
    x, y = data
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("hp", [dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
                                dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)])
def test_matches_torch_adamw_over_1000_steps(hp):
    ours_model, data = make_problem()
    ref_model = copy.deepcopy(ours_model)
    train(ours_model, AdamW(ours_model.parameters(), **hp), data, 1000)
    train(ref_model, torch.optim.AdamW(ref_model.parameters(), foreach=False, **hp), data, 1000)
    for a, b in zip(ours_model.parameters(), ref_model.parameters()):
        assert (a - b).abs().max().item() < 1e-6
    assert not torch.equal(ours_model[0].weight, make_problem()[0][0].weight)  # it did train


def test_state_dict_round_trip_continues_identically():
    model, data = make_problem()
    opt = AdamW(model.parameters(), lr=1e-2)
    train(model, opt, data, 5)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    train(model, opt, data, 5)

    resumed, _ = make_problem(seed=1)
    resumed.load_state_dict(saved_model)
    resumed_opt = AdamW(resumed.parameters(), lr=1e-2)
    resumed_opt.load_state_dict(saved_opt)
    assert resumed_opt.state_dict()["state"][0]["step"] == 5
    train(resumed, resumed_opt, data, 5)
    for a, b in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_parameters_without_gradients_are_left_alone():
    model, data = make_problem()
    frozen = model[2].weight
    frozen.requires_grad_(False)
    before = frozen.clone()
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.5)
    train(model, opt, data, 3)
    assert torch.equal(frozen, before)  # no decay either: it had no gradient
    assert frozen not in opt.state


def test_late_gradient_uses_its_own_step_count():
    # a parameter that first gets a gradient on step 3 must use bias correction for t=1, as torch does
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    a2, b2 = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    ours, ref = AdamW([a, b], lr=0.1), torch.optim.AdamW([a2, b2], lr=0.1)
    for step in range(5):
        for opt, (p, q) in ((ours, (a, b)), (ref, (a2, b2))):
            opt.zero_grad(set_to_none=True)
            loss = (p ** 2).sum() + ((q ** 3).sum() if step >= 2 else 0)
            loss.backward()
            opt.step()
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(b, b2)


def test_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="betas"):
        AdamW([torch.nn.Parameter(torch.zeros(1))], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        AdamW([torch.nn.Parameter(torch.zeros(1))], lr=-1)
