"""`cru_harness.reductions`: sums with the same bits at any CPU thread count, equal to the plain sums up to
float rounding, differentiable where CRU training needs it."""
import torch

from cru_harness.reductions import thread_invariant_outer_sum, thread_invariant_sum


def _at_threads(threads, fn):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(previous)


def test_sum_is_the_same_bits_at_one_two_and_three_threads():
    values = torch.randn(3, 257, 331, generator=torch.Generator().manual_seed(0)) * 1e3  # 255k values
    results = [_at_threads(t, lambda: thread_invariant_sum(values)) for t in (1, 2, 3)]
    assert results[0].shape == ()
    assert all(torch.equal(results[0], r) for r in results[1:])
    assert abs(results[0].item() - values.double().sum().item()) <= 1e-6 * values.abs().sum().item()


def test_sum_of_small_and_empty_tensors():
    assert thread_invariant_sum(torch.tensor([1.0, 2.0, 3.5])).item() == 6.5
    assert thread_invariant_sum(torch.zeros(0)).item() == 0.0


def test_sum_is_differentiable():
    values = torch.randn(5000, requires_grad=True)
    thread_invariant_sum(values * 2).backward()
    assert torch.equal(values.grad, torch.full((5000,), 2.0))


def test_outer_sum_is_the_linear_weight_gradient_at_any_thread_count():
    # A long token dimension and a small output: the GEMM shape BLAS splits across threads.
    gen = torch.Generator().manual_seed(1)
    grad, inputs = torch.randn(3001, 7, generator=gen), torch.randn(3001, 32, generator=gen)
    results = [_at_threads(t, lambda: thread_invariant_outer_sum(grad, inputs, max_elements=20000))
               for t in (1, 2, 3)]
    assert all(torch.equal(results[0], r) for r in results[1:])
    torch.testing.assert_close(results[0], grad.T @ inputs, rtol=1e-5, atol=1e-4)
    # one chunk or many: the same sum up to rounding
    torch.testing.assert_close(thread_invariant_outer_sum(grad, inputs), results[0], rtol=1e-5, atol=1e-4)


def test_router_gradients_equal_plain_autograd_up_to_rounding():
    """The router's CPU linear layers (thread-invariant weight gradient) against nn.Linear's own autograd."""
    from cru_harness.cru.router import Router

    torch.manual_seed(0)
    router = Router(48, 5, 16, input_norm="rms")
    hidden = torch.randn(4, 37, 48, requires_grad=True)
    router(hidden).pow(2).sum().backward()
    ours = [p.grad.clone() for p in router.parameters()] + [hidden.grad.clone()]
    router.zero_grad()
    hidden.grad = None
    normed = hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    torch.sigmoid(router.w2(torch.relu(router.w1(normed)))).pow(2).sum().backward()
    plain = [p.grad for p in router.parameters()] + [hidden.grad]
    for a, b in zip(ours, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
