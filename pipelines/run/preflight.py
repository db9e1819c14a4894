"""Pre-flight: before a pipeline starts, check that credentials resolve, every input can be listed,
the output can be written and a served model's endpoint answers with the model. Each failure is one
line naming the URI and the cause, within seconds, instead of Beam's silent retry loop on a missing
bucket or key."""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipelines.config.storage import StorageConfig
from transforms.intake.listing import literal_prefix
from transforms.store.files import local_write_problem
from transforms.text_safety import redact_url, terminal_safe

# Short timeouts and few retries: a wrong endpoint must fail in seconds, not minutes.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 10


def s3_client(storage: StorageConfig) -> tuple[Any, Any]:
    import boto3
    from botocore.config import Config

    session = boto3.Session(profile_name=storage.s3_profile) if storage.s3_profile else boto3.Session()
    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                    retries={"max_attempts": 2, "mode": "standard"})
    return session, session.client(
        "s3", endpoint_url=storage.s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3"),
        region_name=storage.s3_region or os.environ.get("AWS_DEFAULT_REGION"),
        aws_access_key_id=storage.s3_access_key_id, aws_secret_access_key=storage.s3_secret_access_key,
        aws_session_token=storage.s3_session_token,
        config=config)


def _split(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def _s3_error(uri: str, err: Exception) -> str:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(err, NoCredentialsError):
        return (f"{uri}: no AWS credentials found "
                "(set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or the --s3-* keys)")
    if isinstance(err, EndpointConnectionError):
        return f"{uri}: cannot reach the S3 endpoint ({err})"
    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code", "")
        causes = {"NoSuchBucket": "the bucket does not exist",
                  "InvalidAccessKeyId": "the access key is not known to this endpoint",
                  "SignatureDoesNotMatch": "the secret key is wrong",
                  "AccessDenied": "access denied", "403": "access denied", "404": "the bucket does not exist"}
        return f"{uri}: {causes.get(code, code or 'error')} ({err})"
    return f"{uri}: {type(err).__name__}: {err}"


def _no_credentials() -> Exception:
    from botocore.exceptions import NoCredentialsError

    return NoCredentialsError()


def check_s3_read(uri: str, storage: StorageConfig) -> str | None:
    session, client = s3_client(storage)
    if session.get_credentials() is None and not storage.s3_access_key_id:
        return _s3_error(uri, _no_credentials())
    bucket, key = _split(literal_prefix(uri))
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    except Exception as err:  # noqa: BLE001 - every cause becomes one clear line
        return _s3_error(uri, err)
    return None


def check_s3_write(uri: str, storage: StorageConfig) -> str | None:
    session, client = s3_client(storage)
    if session.get_credentials() is None and not storage.s3_access_key_id:
        return _s3_error(uri, _no_credentials())
    bucket, key = _split(uri.rstrip("/") + f"/.pagemill-preflight-{uuid.uuid4().hex}")
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"")
        client.delete_object(Bucket=bucket, Key=key)
    except Exception as err:  # noqa: BLE001
        return _s3_error(uri, err)
    return None


def check_local_read(pattern: str) -> str | None:
    path = pattern.removeprefix("file://")
    head = literal_prefix(path)
    base = Path(head or ".")
    probe = base if head == path else base.parent if not head.endswith("/") else base
    if not probe.exists():
        return f"{pattern}: no such file or folder"
    return None


def preflight(inputs: Sequence[str], output: str, storage: StorageConfig) -> list[str]:
    """Every problem found, one line each; empty when the run can start."""
    problems: list[str] = []
    for given in inputs:
        uri = given[1:] if given.startswith("@") else given
        if uri.startswith("s3://"):
            problem = check_s3_read(uri, storage)
        elif "://" in uri and not uri.startswith("file://"):
            problem = None  # gs:// and others: Beam's filesystem reports its own errors
        else:
            problem = check_local_read(uri)
        if problem:
            problems.append(f"input {problem}")
    if output.startswith("s3://"):
        problem = check_s3_write(output, storage)
    elif "://" in output and not output.startswith("file://"):
        problem = None
    else:
        problem = local_write_problem(output)  # a probe file under the root (the store makes and removes it)
    if problem:
        problems.append(f"output {problem}")
    return problems


def check_endpoint(endpoint: str, model: str, api_key_env: str | None,
                   auth: dict[str, str] | None = None) -> str | None:
    """`--engine openai`: GET {endpoint}/models answers, within seconds, and lists --model. One line, or None.
    What the endpoint says is untrusted: read up to a cap, printed terminal-safe; the URL's password is never
    printed. A credential about to go over plain http:// to another host is warned about here, once a run."""
    import httpx

    from transforms.engines.openai.endpoint import EndpointRefused, base_url, model_list, plain_http_warning

    if api_key_env and not os.environ.get(api_key_env):
        return f"--api-key-env {api_key_env}: that environment variable is not set"
    warning = plain_http_warning(endpoint, api_key_env)
    if warning:
        print(f"pagemill: warning: {warning}", file=sys.stderr)
    url = base_url(endpoint)
    shown = terminal_safe(redact_url(url + "/models"))
    try:
        entries = model_list(url, api_key_env, httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), auth)
    except httpx.HTTPError as err:
        cause = terminal_safe(redact_url(str(err) or "no answer"))
        return f"--endpoint {shown}: cannot reach the endpoint ({type(err).__name__}: {cause})"
    except EndpointRefused as err:
        if err.status_code in (401, 403):
            return f"--endpoint {shown}: HTTP {err.status_code}: the API key was refused (--api-key-env)"
        return f"--endpoint {shown}: HTTP {err.status_code}: {terminal_safe(err.text[:200])}"
    except ValueError as err:
        return f"--endpoint {shown}: the answer is not an OpenAI model list ({terminal_safe(str(err)[:100])})"
    names = [str(m.get("id")) for m in entries]
    if model not in names:
        served = terminal_safe(", ".join(names[:10])[:300]) or "nothing"
        return f"--model {terminal_safe(model)}: the endpoint does not serve it (it serves: {served})"
    return None
