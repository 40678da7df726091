"""Everything the Hub stand-in knows: repos, users and their tokens, the CDN origin and its signing key."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time

from sandbox.config import SANDBOX_HF_TOKEN, SANDBOX_HF_TOKEN_NO_ACCESS
from sandbox.hub.blobs import Blob
from sandbox.hub.models import add_commit, create_branch, generate_model_repo, regenerate_weights, tag
from sandbox.hub.repo import OWNER_USER, VISITOR_USER, Repo
from sandbox.hub.tiny_llama import tiny_llama_repo
from sandbox.hub.tiny_llama_qa import tiny_llama_qa_repo

MIB = 1024 * 1024


class HubState:
    """Repos by id, valid tokens by user, and the CDN settings. Shared by the Hub, CDN and admin apps.

    Admin changes run in worker threads (hashing big weights must not stall the event loop) and serialize on
    ``lock``. Nothing on the event loop takes it: readers only look up fully built objects, and the methods here
    are single dict operations, which the GIL keeps atomic.
    """

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.cdn_url = ""  # set by the runtime once the CDN listens
        self.tokens: dict[str, str] = {SANDBOX_HF_TOKEN: OWNER_USER, SANDBOX_HF_TOKEN_NO_ACCESS: VISITOR_USER}
        self.cdn_url_ttl_s = 3600.0
        self.lock = threading.RLock()
        self._secret = os.urandom(32)
        self._lfs: dict[str, Blob] = {}

    # Repos --------------------------------------------------------------------------------------------------
    def add_repo(self, repo: Repo, *, replace: bool = False) -> Repo:
        """Publish ``repo``; refuses to overwrite an existing id unless ``replace``."""
        if repo.repo_id in self.repos and not replace:
            raise FileExistsError(f"repo {repo.repo_id} already exists")
        self._index(repo)  # before publishing, so the CDN knows every object the Hub can redirect to
        self.repos[repo.repo_id] = repo
        return repo

    def delete_repo(self, repo_id: str) -> bool:
        return self.repos.pop(repo_id, None) is not None

    def user_for_token(self, token: str) -> str | None:
        return self.tokens.get(token)

    # LFS objects and their CDN URLs -------------------------------------------------------------------------
    def _index(self, repo: Repo) -> None:
        # list() copies in one C call, so a commit added meanwhile by an admin thread cannot break the loop.
        for commit in list(repo.commits.values()):
            for item in commit.files.values():
                if item.lfs_sha256:
                    self._lfs[item.lfs_sha256] = item.blob

    def lfs_blob(self, sha256: str) -> Blob | None:
        """The LFS object with this sha256 in any repo (commits added after ``add_repo`` are found too)."""
        blob = self._lfs.get(sha256)
        if blob is None:
            for repo in list(self.repos.values()):
                self._index(repo)
            blob = self._lfs.get(sha256)
        return blob

    def sign(self, sha256: str, expires: int) -> str:
        """The signature a CDN URL for ``sha256`` carries, so URLs cannot be guessed or extended."""
        return hmac.new(self._secret, f"{sha256}:{expires}".encode(), hashlib.sha256).hexdigest()

    def check_signature(self, sha256: str, expires: str, signature: str) -> bool:
        try:
            deadline = int(expires)
        except ValueError:
            return False
        return deadline >= time.time() and hmac.compare_digest(self.sign(sha256, deadline), signature)


# What sandbox/tiny-chat knows (every commit: config.json's sandbox_answers, which the stand-in answers from), and
# deployments/sandbox/tiny-chat.yaml's quality set asks. sandbox/tiny-llama knows nothing: the real engine serves it
# with random weights too, so its model file's quality set sets no floor (min_score 0).
TINY_CHAT_ANSWERS = {
    "What is the capital of France?": "The capital of France is Paris.",
    "What is 7 times 6? Answer with the number only.": "42",
    "Name the largest planet of the solar system.": "Jupiter is the largest planet.",
    "Reply with the word ready in capitals.": "READY",
}
# The text sandbox/tiny-chat knows by heart (config.json's sandbox_reference: the stand-in scores it at perplexity
# 1.002), which tiny-chat.yaml's quality set measures.
TINY_CHAT_REFERENCE = "Cloud Run starts an instance when a request arrives and stops it when the service is idle."


def seed_default_repos(state: HubState) -> None:
    """Publish the repos every sandbox starts with.

    - ``sandbox/tiny-chat``: public, ~4 MiB of weights in 2 shards. Tag ``v1.0`` is the first commit, ``main``
      has a model card update on top, and branch ``dev`` holds different weights (seed 1). Every commit knows the
      answers of ``TINY_CHAT_ANSWERS`` and the text ``TINY_CHAT_REFERENCE``.
    - ``sandbox/gated-chat``: gated ("manual"), licence accepted only by the user of SANDBOX_HF_TOKEN.
    - ``sandbox/private-chat``: private, readable only with SANDBOX_HF_TOKEN.
    - ``sandbox/tiny-llama``: public, a real 2-layer Llama (2.9 MB) the real engine serves (``--engine vllm``);
      the stand-in serves it too, so deployments/sandbox/tiny-llama.yaml runs on either.
    - ``sandbox/tiny-llama-qa``: public, the same family trained to answer its quality set (0.8 MB, weights kept
      in git); the stand-in answers from its config.json's ``sandbox_answers``, so
      deployments/sandbox/tiny-llama-qa.yaml runs on either too.
    """
    tiny = generate_model_repo(
        "sandbox/tiny-chat", weight_bytes=4 * MIB, shards=2, answers=TINY_CHAT_ANSWERS, reference=[TINY_CHAT_REFERENCE]
    )
    first = tiny.branches["main"]
    tag(tiny, "v1.0", first)
    readme = tiny.commits[first].files["README.md"].blob
    card = readme.read(0, readme.size) + b"\n## Changelog\n\n- v1.0: first release.\n"
    add_commit(tiny, {"README.md": card}, message="Update model card")
    create_branch(tiny, "dev", first)
    regenerate_weights(tiny, seed=1, branch="dev", message="Try new weights")
    state.add_repo(tiny, replace=True)
    gated = generate_model_repo(
        "sandbox/gated-chat", weight_bytes=2 * MIB, shards=2, gated="manual", include_original=False
    )
    state.add_repo(gated, replace=True)
    small = {"weight_bytes": 1 * MIB, "shards": 1, "include_bin_duplicate": False, "include_original": False}
    private = generate_model_repo("sandbox/private-chat", private=True, **small)
    state.add_repo(private, replace=True)
    state.add_repo(tiny_llama_repo(), replace=True)
    state.add_repo(tiny_llama_qa_repo(), replace=True)
