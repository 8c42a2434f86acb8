"""Test helper: rewrite a `gemma4-assistant` GGUF written by gemma4cpu.convert in the other on-disk
schemas of Gemma 4 MTP assistants (spec 3.4), same model:

  gemma4_mtp        ik_llama.cpp (3.4b): keys `gemma4_mtp.*` with `backbone_embedding_length`,
                    `centroid_count`, no `nextn_predict_layers`, head_count_kv always an i32 array;
                    tensors mtp_pre_proj / mtp_post_proj / mtp_centroids, the HF permutation turned
                    into ik's token -> centroid map `mtp_token_ordering.weight` (I32); no rope_freqs
  gemma4_assistant  seen in published files: keys under `gemma4_assistant.`, names otherwise as
                    gemma4-assistant, tensors unchanged

Tokenizer and general.* keys are copied as they are; tensor bytes and types are copied unchanged.
"""
from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

SRC_ARCH = "gemma4-assistant"
SCHEMAS = ("gemma4_mtp", "gemma4_assistant")

_MTP_KEYS = {"embedding_length_out": "backbone_embedding_length", "n_centroids": "centroid_count",
             "nextn_predict_layers": None}
_MTP_TENSORS = {"nextn.pre_projection.weight": "mtp_pre_proj.weight",
                "nextn.post_projection.weight": "mtp_post_proj.weight",
                "masked_embd_centroids.weight": "mtp_centroids.weight",
                "masked_embd_ordering": "mtp_token_ordering.weight",
                "rope_freqs.weight": None}
_READER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture")


def token_to_centroid(ordering: np.ndarray, n_centroids: int) -> np.ndarray:
    """ik's map from HF's permutation (cluster c = ordering[c*V/n_c : (c+1)*V/n_c]):
    inv[ordering[j]] = j; t2c = inv // (V / n_c)."""
    ordering = np.asarray(ordering, dtype=np.int64)
    inv = np.empty_like(ordering)
    inv[ordering] = np.arange(ordering.size)
    return (inv // (ordering.size // n_centroids)).astype(np.int32)


def _value(f):
    """(value, type, sub_type) of a reader field, strings as raw bytes."""
    vt = f.types[0]
    if vt == VT.ARRAY:
        sub = f.types[1]
        if sub == VT.STRING:
            return [bytes(f.parts[i]) for i in f.data], vt, sub
        return [x.item() for i in f.data for x in f.parts[i]], vt, sub
    if vt == VT.STRING:
        return bytes(f.parts[f.data[0]]), vt, None
    return f.parts[f.data[0]][0].item(), vt, None


def rewrite_assistant(src_path, dst_path, schema: str) -> None:
    """Write the gemma4-assistant file src_path again as dst_path in `schema` (one of SCHEMAS)."""
    if schema not in SCHEMAS:
        raise ValueError(f"schema {schema!r} not in {SCHEMAS}")
    r = gguf.GGUFReader(str(src_path))
    arch = r.fields["general.architecture"].contents()
    if arch != SRC_ARCH:
        raise ValueError(f"{src_path}: arch {arch!r} is not {SRC_ARCH}")
    pre = SRC_ARCH + "."
    n_layer = int(r.fields[pre + "block_count"].contents())
    w = gguf.GGUFWriter(str(dst_path), schema)
    for key, f in r.fields.items():
        if key in _READER_FIELDS:
            continue
        val, vt, sub = _value(f)
        if key.startswith(pre):
            name = key[len(pre):]
            if schema == "gemma4_mtp":
                name = _MTP_KEYS.get(name, name)
                if name is None:
                    continue
                if name == "attention.head_count_kv":
                    val = [int(x) for x in (val if vt == VT.ARRAY else [val] * n_layer)]
                    vt, sub = VT.ARRAY, VT.INT32
            key = f"{schema}.{name}"
        w.add_key_value(key, val, vt, sub_type=sub)
    n_c = int(r.fields[pre + "n_centroids"].contents()) if pre + "n_centroids" in r.fields else 0
    for t in r.tensors:
        name, data = t.name, np.asarray(t.data)
        if schema == "gemma4_mtp":
            name = _MTP_TENSORS.get(name, name)
            if name is None:
                continue
            if t.name == "masked_embd_ordering":
                data = token_to_centroid(data, n_c)
        w.add_tensor(name, data, raw_dtype=T(t.tensor_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
