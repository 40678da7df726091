"""Runtime Hub access at start-up: vLLM loading its tokenizer from a Hugging Face repo.

``--tokenizer REPO`` (a repo id, not a directory) makes vLLM call transformers' ``AutoTokenizer.from_pretrained``,
which downloads ``tokenizer_config.json`` and ``config.json`` from the Hub with ``HF_TOKEN``; that is what a
profile's ``hf_token_at_runtime`` is for (a gated tokenizer, adapters). ``HF_HUB_OFFLINE=1`` forbids it.

The container reaches "the internet" only through ``HF_ENDPOINT``, which the Cloud Run stand-in sets from the
revision's egress (sandbox/control/run/egress.py): the Hub stand-in, or a black hole. Reachable, the files come
over real HTTP with huggingface_hub (the Hub's request log shows them, user agent ``transformers/...;
file_type/tokenizer``). Unreachable, one attempt times out on the sandbox clock, then the rest of
huggingface_hub's retries (1, 2, 4, 8, 8 s; each attempt a 10 s timeout) pass on that clock too, and the
container dies with the error chain users see (LocalEntryNotFoundError, then transformers' OSError "We couldn't
connect to 'https://huggingface.co' to load this file ...", e.g. bitsandbytes issue 34, Matte-Anything issue 15).
"""

from __future__ import annotations

from sandbox.vllm.errors import VllmStartupError
from sandbox.vllm.instance import InstanceEnv
from sandbox.vllm.logs import VllmLog
from sandbox.vllm.model import is_repo_id
from sandbox.vllm.timing import SimClock

PUBLIC_HUB = "https://huggingface.co"  # what the container believes it talks to; HF_ENDPOINT is plumbing
TOKENIZER_FILES = ("tokenizer_config.json", "config.json")
ETAG_TIMEOUT_S = 10.0  # huggingface_hub's default per attempt
RETRY_SLEEPS_S = (1, 2, 4, 8, 8)  # huggingface_hub's backoff on a failed request (5 retries)
MIN_REAL_TIMEOUT_S = 0.2  # host scheduling noise is not simulated time
TRANSFORMERS_VERSION = "4.57.1"
OFFLINE = ("1", "true", "yes", "on")
OFFLINE_DOCS = "https://huggingface.co/docs/transformers/installation#offline-mode"


def _unreachable(repo: str, filename: str, cause: VllmStartupError) -> VllmStartupError:
    return VllmStartupError(
        "OSError",
        f"We couldn't connect to '{PUBLIC_HUB}' to load this file, couldn't find it in the cached files and it "
        f"looks like {repo} is not the path to a directory containing a file named {filename}.\nCheckout your "
        f"internet connection or see how to run the library in offline mode at '{OFFLINE_DOCS}'.",
        where="transformers/utils/hub.py",
        cause=cause,
    )


def load_tokenizer(tokenizer: str | None, env: InstanceEnv, log: VllmLog, clock: SimClock) -> None:
    """Fetch the tokenizer's files when ``tokenizer`` names a Hub repo; raise as vLLM would when it cannot."""
    if not tokenizer or tokenizer.startswith("/") or not is_repo_id(tokenizer):
        return  # a directory (or the model's own folder): nothing leaves the container
    import httpx  # here, not at module level: most containers never reach the Hub, and start-up time counts

    filename = TOKENIZER_FILES[0]
    if env.env_flag("HF_HUB_OFFLINE").lower() in OFFLINE:
        cause = VllmStartupError(
            "huggingface_hub.errors.LocalEntryNotFoundError",
            "Cannot find the requested files in the disk cache and outgoing traffic has been disabled. To enable "
            "hf.co look-ups and downloads online, set 'local_files_only' to False.",
            where="huggingface_hub/file_download.py",
        )
        raise _unreachable(tokenizer, filename, cause)
    endpoint = env.env_flag("HF_ENDPOINT")
    url = f"{endpoint}/{tokenizer}/resolve/main/{filename}"
    shown = f"{PUBLIC_HUB}/{tokenizer}/resolve/main/{filename}"
    timeout = max(ETAG_TIMEOUT_S * env.time_scale, MIN_REAL_TIMEOUT_S)
    try:
        if not endpoint:
            raise httpx.ConnectError("[Errno 101] Network is unreachable")  # no route was ever given: no internet
        httpx.head(url, timeout=timeout)
    except httpx.TransportError as exc:
        reason = "timed out" if isinstance(exc, httpx.TimeoutException) else str(exc)
        log.sandbox(f"{tokenizer}: the Hub is unreachable from this revision's egress ({reason})")
        for attempt, pause in enumerate(RETRY_SLEEPS_S, start=1):
            print(f"'{reason}' thrown while requesting HEAD {shown}", flush=True)
            print(f"Retrying in {pause}s [Retry {attempt}/{len(RETRY_SLEEPS_S)}].", flush=True)
            clock.sleep(pause + ETAG_TIMEOUT_S)  # the pause, then the next attempt's timeout
        print(f"'{reason}' thrown while requesting HEAD {shown}", flush=True)
        cause = VllmStartupError(
            "huggingface_hub.errors.LocalEntryNotFoundError",
            "An error happened while trying to locate the file on the Hub and we cannot find the requested files "
            "in the local cache. Please check your connection and try again or make sure your Internet connection "
            "is on.",
            where="huggingface_hub/file_download.py",
        )
        raise _unreachable(tokenizer, filename, cause) from None
    _download(tokenizer, endpoint, env, log, timeout)


def _download(repo: str, endpoint: str, env: InstanceEnv, log: VllmLog, timeout: float) -> None:
    """The tokenizer's files over real HTTP, as transformers asks for them (a missing optional file is fine)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    token = env.env_flag("HF_TOKEN") or None
    for filename in TOKENIZER_FILES:
        try:
            hf_hub_download(
                repo,
                filename,
                endpoint=endpoint,
                token=token if token else False,
                etag_timeout=timeout,
                cache_dir=env.root / "root" / ".cache" / "huggingface" / "hub",
                library_name="transformers",
                library_version=TRANSFORMERS_VERSION,
                user_agent={"file_type": "tokenizer", "from_auto_class": "True"},
            )
        except EntryNotFoundError:
            continue  # transformers treats tokenizer_config.json as optional
        except GatedRepoError:
            raise VllmStartupError(
                "OSError",
                f"You are trying to access a gated repo.\nMake sure to have access to it at {PUBLIC_HUB}/{repo}.\n"
                f"401 Client Error. (Request ID: sandbox)\n\nCannot access gated repo for url {PUBLIC_HUB}/{repo}/"
                f"resolve/main/{filename}.",
                where="transformers/utils/hub.py",
            ) from None
        except RepositoryNotFoundError:
            raise VllmStartupError(
                "OSError",
                f"{repo} is not a local folder and is not a valid model identifier listed on '{PUBLIC_HUB}/models'"
                "\nIf this is a private repository, make sure to pass a token having permission to this repo either "
                "by logging in with `hf auth login` or by passing `token=<your_token>`",
                where="transformers/utils/hub.py",
            ) from None
    log.sandbox(f"tokenizer {repo}: {', '.join(TOKENIZER_FILES)} fetched from the Hub with HF_TOKEN")
