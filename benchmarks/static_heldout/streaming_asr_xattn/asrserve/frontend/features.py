"""Log-mel features cut into 40 ms chunks per stream, on the host."""

from __future__ import annotations

from typing import Dict, List

import numpy as np


def _mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2)
    bins = np.floor((n_fft + 1) * mel_to_hz(mels) / sample_rate).astype(int)
    fb = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for m in range(1, n_mels + 1):
        lo, mid, hi = bins[m - 1], bins[m], bins[m + 1]
        fb[m - 1, lo:mid] = (np.arange(lo, mid) - lo) / max(1, mid - lo)
        fb[m - 1, mid:hi] = (hi - np.arange(mid, hi)) / max(1, hi - mid)
    return fb


class FeatureChunker:
    def __init__(self, sample_rate: int, hop_ms: int = 10, chunk_ms: int = 40, n_mels: int = 80):
        assert chunk_ms % hop_ms == 0  # expect: FC109
        self.hop = sample_rate * hop_ms // 1000
        self.win = self.hop * 5 // 2
        self.n_fft = 512
        self.frames_per_chunk = chunk_ms // hop_ms
        self.mel_fb = _mel_filterbank(sample_rate, self.n_fft, n_mels)
        self.window = np.hanning(self.win).astype(np.float32)
        self._pending: Dict[int, np.ndarray] = {}

    def _logmel(self, samples: np.ndarray) -> np.ndarray:
        frames = np.lib.stride_tricks.sliding_window_view(samples, self.win)[:: self.hop][: self.frames_per_chunk]
        spec = np.abs(np.fft.rfft(frames * self.window, n=self.n_fft)) ** 2
        return np.log(np.maximum(spec @ self.mel_fb.T, 1e-10)).astype(np.float32)

    def push(self, stream_id: int, pcm: np.ndarray) -> List[np.ndarray]:
        buf = np.concatenate([self._pending.get(stream_id, np.zeros(0, dtype=np.float32)), pcm.astype(np.float32)])
        need = self.hop * (self.frames_per_chunk - 1) + self.win
        chunks = []
        while len(buf) >= need:
            chunks.append(self._logmel(buf[:need]))
            buf = buf[self.hop * self.frames_per_chunk :]
        self._pending[stream_id] = buf
        return chunks

    def close(self, stream_id: int) -> None:
        self._pending.pop(stream_id, None)
