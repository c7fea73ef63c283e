"""The window arithmetic of long_form="sequential" (engine.whisper.sequential), on
fabricated tokens: segments between consecutive timestamps, where the next window starts,
and what the next window is prompted with — openai-whisper's transcribe rules."""

from __future__ import annotations

import pytest

from engine.whisper.params import TranscribeParams
from engine.whisper.sequential import MAX_PROMPT_TOKENS, N_FRAMES, SequentialState, window_segments

TS = 50000      # a timestamp_begin: TS + k is <|k * 0.02|>


def ts(seconds: float) -> int:
    return TS + round(seconds / 0.02)


@pytest.mark.parametrize("tokens, window_frames, segments, frames_used", [
    # two closed segments, then an unfinished one: seek to the last closed timestamp
    ([ts(0), 1, 2, ts(2), ts(2.5), 3, ts(5), ts(5.2), 4], N_FRAMES,
     [(0.0, 2.0, [ts(0), 1, 2, ts(2)]), (2.5, 5.0, [ts(2.5), 3, ts(5)])], 500),
    # a single timestamp at the end: nothing more in this window
    ([ts(0), 1, ts(1), ts(1.5), 2, ts(3)], 1200,
     [(0.0, 1.0, [ts(0), 1, ts(1)]), (1.5, 3.0, [ts(1.5), 2, ts(3)])], 1200),
    # no consecutive timestamps: one segment to the last timestamp, the whole window used
    ([ts(0), 1, 2, ts(4)], N_FRAMES, [(0.0, 4.0, [ts(0), 1, 2, ts(4)])], N_FRAMES),
    # no timestamp at all: one segment over the window's audio
    ([1, 2], 800, [(0.0, 8.0, [1, 2])], 800),
])
def test_window_segments(tokens, window_frames, segments, frames_used):
    assert window_segments(tokens, TS, window_frames) == (segments, frames_used)


def test_state_moves_on_and_keeps_the_prompt():
    state = SequentialState(num_frames=4000)
    assert state.window_frames == N_FRAMES and state.prompt == []
    kept = state.advance([ts(0), 1, 2, ts(2), ts(2.5), 3, ts(5), ts(5.2), 4], TS, 0.0, has_text=lambda ids: True)
    assert [s[:2] for s in kept] == [(0.0, 2.0), (2.5, 5.0)] and state.seek == 500
    assert state.prompt == [ts(0), 1, 2, ts(2), ts(2.5), 3, ts(5)]
    assert state.window_frames == 3000
    state.skip_window()
    assert state.seek == 3500 and state.window_frames == 500 and not state.is_done
    state.advance([ts(0), 7, ts(1)], TS, 0.6, has_text=lambda ids: True)     # hot: history reset
    assert state.prompt == [] and state.is_done


def test_silent_segments_and_long_history_stay_out_of_the_prompt():
    state = SequentialState(num_frames=10 * N_FRAMES)
    kept = state.advance([ts(0), ts(1), ts(1), 5, ts(2)], TS, 0.0, has_text=lambda ids: 5 in ids)
    assert [s[:2] for s in kept] == [(1.0, 2.0)]
    state.all_tokens = list(range(1000))
    assert state.prompt == list(range(1000 - MAX_PROMPT_TOKENS, 1000))


def test_long_form_is_checked():
    assert TranscribeParams(long_form="sequential").long_form == "sequential"
    with pytest.raises(ValueError, match="long_form must be one of"):
        TranscribeParams(long_form="chunked")
