import json
import re

import pytest

from evalkit.corpus import builtin_tokenizer, prose_documents


@pytest.fixture(scope="session")
def small_tokenizer():
    """A vocab-512 tokenizer: the small-vocabulary kind tiny models use."""
    return builtin_tokenizer(512)


@pytest.fixture(scope="session")
def qa_dir(tmp_path_factory):
    """Tiny SQuAD v2 dev and HotpotQA dev-distractor files in the real formats."""
    folder = tmp_path_factory.mktemp("qa")
    docs = [re.sub(r"\s+", " ", doc)[:500] for doc in prose_documents()[:200]]
    articles = []
    for a in range(20):
        paragraphs = []
        for p in range(4):
            context = docs[a * 4 + p]
            answer = context.split()[5]
            answers = [{"text": answer, "answer_start": context.index(answer)}, {"text": answer, "answer_start": 0}]
            unanswerable = {"text": "nothing", "answer_start": 0}
            qas = [
                {
                    "id": f"{a}-{p}",
                    "question": f"Which word is sixth in {a}-{p}?",
                    "is_impossible": False,
                    "answers": answers,
                },
                {
                    "id": f"{a}-{p}-x",
                    "question": f"Unanswerable {a}-{p}?",
                    "is_impossible": True,
                    "answers": [],
                    "plausible_answers": [unanswerable],
                },
            ]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Article {a}", "paragraphs": paragraphs})
    (folder / "dev-v2.0.json").write_text(json.dumps({"version": "v2.0", "data": articles}))
    hotpot = []
    for q in range(30):
        context = [
            [f"Title {q}-{j}", [s + ". " for s in docs[80 + (q * 7 + j) % 120][:240].split(". ")]] for j in range(10)
        ]
        hotpot.append(
            {
                "_id": f"h{q}",
                "question": f"Is title {q}-0 first?",
                "answer": f"yes {q}",
                "type": "comparison",
                "level": "easy",
                "supporting_facts": [[context[0][0], 0]],
                "context": context,
            }
        )
    (folder / "hotpot_dev_distractor_v1.json").write_text(json.dumps(hotpot))
    return folder
