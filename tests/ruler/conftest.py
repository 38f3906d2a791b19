import pytest

from evalkit.corpus import builtin_tokenizer
from tests.helpers import write_qa_files


@pytest.fixture(scope="session")
def small_tokenizer():
    """A vocab-512 tokenizer: the small-vocabulary kind tiny models use."""
    return builtin_tokenizer(512)


@pytest.fixture(scope="session")
def qa_dir(tmp_path_factory):
    """Tiny SQuAD v2 dev and HotpotQA dev-distractor files in the real formats."""
    return write_qa_files(tmp_path_factory.mktemp("qa"))
