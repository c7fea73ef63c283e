"""jobs.chat: strings become chat messages only when a generate job asks."""

import pytest

from jobs.chat import chat_prompts
from jobs.spec import JobSpec, JobSpecError
from jobs.validate import sampling_kwargs

MESSAGES = [{"role": "user", "content": "Hi"}]


def test_strings_pass_raw_without_chat():
    assert chat_prompts(["Hi", None], {}) == ["Hi", None]


def test_strings_become_a_user_message_after_the_system_prompt():
    prompts = chat_prompts(["Hi", None, MESSAGES], {"chat": True, "system_prompt": "Be brief."})
    assert prompts == [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None, MESSAGES]
    assert chat_prompts(["Hi"], {"chat": True}) == [MESSAGES]


def test_chat_params_are_not_sampling_params():
    assert sampling_kwargs({"chat": True, "system_prompt": "x", "max_tokens": 4, "stop": ["."]}) == {
        "max_tokens": 4, "stop": (".",)}


def test_a_system_prompt_needs_chat():
    with pytest.raises(JobSpecError, match="params.system_prompt"):
        JobSpec(mode="generate", model="smollm2", input="in.parquet", output="out/", params={"system_prompt": "x"})
    JobSpec(mode="generate", model="smollm2", input="in.parquet", output="out/",
            params={"chat": True, "system_prompt": "x"})


def _messages_file(path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    messages = pa.array([MESSAGES], pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    pq.write_table(pa.table({"messages": messages}), path)
    return str(path)


def test_a_column_of_chat_messages_is_no_embed_jobs_input(tmp_path):
    """Generate renders messages as prompts; classify and score (a reward model) take them too."""
    from jobs.validate import check_job
    source = _messages_file(tmp_path / "chat.parquet")
    check_job(JobSpec(mode="generate", model="smollm2", input=source, output=str(tmp_path / "g"),
                      input_column="messages"))
    with pytest.raises(JobSpecError, match="only generate, classify and score jobs take messages") as refused:
        check_job(JobSpec(mode="embed", model="minilm", input=source, output=str(tmp_path / "e"),
                          input_column="messages"))
    assert refused.value.field == "input_column"
