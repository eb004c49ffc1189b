"""dynamo_relational.cost: the estimates the cost-model passes compare."""
import torch

from dynamo_relational import cost


def test_cpu_flop_rate_scales_with_threads_and_bandwidth_does_not():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cost.rates(torch.device("cpu"))
        torch.set_num_threads(2)
        two = cost.rates(torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert two[0] == 2 * one[0] and two[1] == one[1]
    assert cost.rates(torch.device("cuda")) == cost.RATES["cuda"]


def test_estimates_grow_with_the_work_and_add_up():
    small, large = cost.linear(1000, 7, 10, 4), cost.linear(2000, 7, 10, 4)
    assert small.flops == 2 * 1000 * 7 * 10 and large.flops == 2 * small.flops
    assert large.seconds("cpu") > small.seconds("cpu") > 0
    both = small + cost.gather(500, 10, 4)
    assert both.seconds("cpu") > small.seconds("cpu")
    assert cost.gather_reduce(4000, 1000, 10, 4).bytes > cost.gather_reduce(2000, 1000, 10, 4).bytes
