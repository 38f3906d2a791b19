"""evalkit.models.precision: the one map from evalkit's dtype names to torch's and the libraries', and devices."""

import pytest
import torch

from evalkit.errors import UserError
from evalkit.models.precision import (
    DTYPE_NAMES,
    check_dtype,
    engine_dtype,
    long_dtype_name,
    resolve_device,
    torch_dtype,
)

EXPECTED = {
    "bf16": (torch.bfloat16, "bfloat16"),
    "fp16": (torch.float16, "float16"),
    "fp32": (torch.float32, "float32"),
}


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_name_maps_to_its_torch_dtype_and_long_name(name):
    expected_dtype, expected_long = EXPECTED[name]
    assert torch_dtype(name) is expected_dtype
    assert long_dtype_name(name) == expected_long
    assert check_dtype(name) == name


def test_names_are_exactly_these_three():
    assert set(DTYPE_NAMES) == set(EXPECTED)


@pytest.mark.parametrize("name", ["bfloat16", "fp8", "", "FP32"])
def test_unknown_names_are_one_line_errors_listing_the_choices(name):
    with pytest.raises(UserError, match=f"unknown dtype '{name}'; choose one of: bf16, fp16, fp32"):
        torch_dtype(name)


def test_a_restricted_choice_refuses_the_other_names():
    assert check_dtype("fp32", ("bf16", "fp32")) == "fp32"
    with pytest.raises(UserError, match="choose one of: bf16, fp32$"):
        check_dtype("fp16", ("bf16", "fp32"))


def test_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(UserError, match="unknown device 'gpu0'; use auto, cpu, cuda or cuda:N"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="torch sees no CUDA device"):
            resolve_device("cuda:0")


def test_the_engine_dtype_is_the_one_asked_for_else_bf16_on_cuda_and_fp32_elsewhere():
    """The one resolution the engines compute in and the benchmarks key stored results by."""
    assert engine_dtype("fp16", "cpu") == "fp16"
    assert engine_dtype(None, "cpu") == "fp32"
    assert engine_dtype() == ("bf16" if torch.cuda.is_available() else "fp32")
    with pytest.raises(UserError, match="unknown dtype 'int4'"):
        engine_dtype("int4")
