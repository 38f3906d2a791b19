"""One torch thread for the modules that run tiny models.

Tiny models gain nothing from threads, and on a shared, busy machine OpenMP threads that wait
for a busy core spin: the engine tests took 2 s on one thread and over 60 s on two under load,
and a greedy decoding beside vLLM's engine process 12.5 s instead of 0.4 s.
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
