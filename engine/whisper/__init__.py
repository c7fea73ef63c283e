"""Whisper transcription: audio in, timestamped text out (Engine mode "transcribe")."""
