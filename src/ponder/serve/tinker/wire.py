"""The Tinker client's binary messages: a forward_backward request in, a
forward_backward output and a sample response out, as protobuf (the `tinker`
package's own `tinker_public.proto`).

The client sends forward_backward as `application/x-protobuf` (zstd-compressed when the
server asks for it, which this one does not) and reads `ForwardBackwardOutput` and
`SampleResponse` only as protobuf; every other message is JSON. Tensors travel as raw
little-endian bytes: token ids int32, loss inputs float32 or int64 with a shape.
Anything this server cannot train on (an image or audio chunk, a sparse or 2-D loss
input) is a `WireError` naming the datum and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ponder.extras import require

_NUMPY_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}  # the proto's DType enum


class WireError(ValueError):
    """A message that does not decode into something this server trains on."""


@dataclass
class DatumArrays:
    """One datum: its input token ids and loss inputs, each a 1-D array as long as them."""

    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackwardCall:
    """A decoded forward_backward request."""

    model_id: str
    seq_id: int
    loss_fn: str
    forward_only: bool
    data: list[DatumArrays]
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)


def _pb() -> Any:
    return require("tinker.proto.tinker_public_pb2", "tinker", "ponder tinker-serve")


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """The request the client serialised (tinker/proto/request_conv.py), checked."""
    pb = _pb()
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as err:  # protobuf's DecodeError and friends: any undecodable body
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest protobuf ({err})") from None
    config: dict[str, float | str] = {key: value for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = [_datum(i, datum) for i, datum in enumerate(message.data)]
    return ForwardBackwardCall(message.model_id, message.seq_id, message.loss_fn, message.forward_only, data, config)


def _datum(index: int, datum: Any) -> DatumArrays:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"datum {index}: model_input has a {kind} chunk; this server trains on text tokens only")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    inputs = {name: _tensor(index, name, tensor) for name, tensor in datum.loss_fn_inputs.items()}
    return DatumArrays(tokens, inputs)


def _tensor(index: int, name: str, tensor: Any) -> np.ndarray:
    where = f"datum {index}: loss_fn_inputs[{name!r}]"
    if tensor.WhichOneof("encoding") != "dense":
        raise WireError(f"{where} is sparse; send it dense ([N] values, one per input token)")
    dtype = _NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise WireError(f"{where} has dtype {tensor.dtype}; expected float32 or int64")
    values = np.frombuffer(tensor.dense, dtype=dtype)
    shape = list(tensor.shape) or [values.size]
    if len(shape) != 1 or shape[0] != values.size:
        raise WireError(f"{where} has shape {shape}; this server takes 1-D tensors, one value per input token")
    return values


def encode_forward_backward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """`ForwardBackwardOutput`: one ArrayRecord whose `logprobs` field holds each datum's
    target log-probs (float32, datum i at byte offsets [offsets[i], offsets[i+1]))."""
    pb = _pb()
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        output.metrics[key] = float(value)
    record = output.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(logprobs))
    record.fields["logprobs"].CopyFrom(_batched(logprobs))
    return output.SerializeToString()


def _batched(arrays: list[np.ndarray]) -> Any:
    pb = _pb()
    parts = [np.ascontiguousarray(a, dtype=np.float32) for a in arrays]
    offsets = np.cumsum([0] + [p.nbytes for p in parts], dtype=np.int64)
    data = b"".join(p.tobytes() for p in parts)
    return pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


@dataclass
class SampledSequence:
    """One sample: its tokens, their log-probs under the sampling distribution, and
    why it ended (`stop`: a stop token or string, `length`: max_tokens)."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def encode_sample_response(sequences: list[SampledSequence], prompt_logprobs: list[float] | None) -> bytes:
    """`SampleResponse` (tinker/proto/response_conv.py reads it); prompt_logprobs has
    NaN at position 0, which the client reads as None."""
    pb = _pb()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    response = pb.SampleResponse()
    for sequence in sequences:
        response.sequences.add(
            stop_reason=reasons[sequence.stop_reason],
            tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(sequence.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        response.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return response.SerializeToString()
