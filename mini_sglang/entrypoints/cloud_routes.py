"""SGLang's routes for hosted platforms (0.5.4 paths and replies).

- GET /ping -> 200, empty body (SageMaker's health check).
- POST /invocations -> /v1/chat/completions (SageMaker; in openai/routes.py).
- POST $AIP_PREDICT_ROUTE (default /vertex_generate), Vertex AI's prediction format:
  {"instances": [{"text": ...} | {"input_ids": [...]}, ...], "parameters": {...}} is the
  /generate batch of the instances' inputs with `parameters` as the other GenerateReqInput
  fields (sampling_params, return_logprob, ...); the reply is {"predictions": [one /generate
  result per instance]}, or [] when there are no instances. Errors are /generate's.
  The path is read when this module is imported.
  Example: {"instances": [{"text": "Hi"}, {"text": "Yo"}], "parameters": {"sampling_params":
  {"max_new_tokens": 4}}} -> {"predictions": [{"text": ..., "meta_info": ...}, {...}]}.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import (
    error_response,
    http_exception_response,
    orjson_response,
    parse_json_body,
    validation_error_response,
)
from mini_sglang.entrypoints.server_state import ServerStateDep
from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.generate import GenerateReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted, SchedulerRefused
from mini_sglang.utils.dataclass_validation import BodyValidationError


def vertex_to_generate(body: dict) -> dict | None:
    """The /generate body for a Vertex request body, or None when it has no instances."""
    instances, parameters = body.get("instances"), body.get("parameters") or {}
    if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
        raise ValueError('instances must be a list of objects, e.g. [{"text": "Hello"}].')
    if not isinstance(parameters, dict):
        raise ValueError("parameters must be an object of /generate fields.")
    if not instances:
        return None
    inputs = {}
    for key in ("text", "input_ids", "input_embeds"):
        if instances[0].get(key):  # the first instance decides which input all of them give
            inputs[key] = [instance.get(key) for instance in instances]
            break
    images = [i["image_data"] for i in instances if i.get("image_data") is not None]
    return {**inputs, **({"image_data": images} if images else {}), **parameters}


router = APIRouter()


@router.get("/ping")
async def ping() -> Response:
    return Response(status_code=200)


@router.post(envs.AIP_PREDICT_ROUTE.get())
async def vertex_generate(request: Request, state: ServerStateDep) -> Response:
    try:
        body = vertex_to_generate(await parse_json_body(request))
        if body is None:
            return orjson_response([])
        obj = GenerateReqInput.from_json_dict(body)
    except BodyValidationError as e:
        return validation_error_response(str(e))
    except (ValueError, TypeError) as e:
        return error_response(str(e))
    try:
        ret = await state.tokenizer_manager.generate_request(obj, request).__anext__()
    except (ValueError, TypeError, RequestAborted) as e:
        return error_response(str(e))
    except SchedulerRefused as e:
        return http_exception_response(e.status_code, e.message)
    return orjson_response({"predictions": ret})
