"""A local HTTP server that speaks enough of the Hugging Face Hub's API for
huggingface_hub (HF_ENDPOINT=http://127.0.0.1:PORT) to resolve and download models:

    GET  /api/models/{org}/{name}[/revision/{revision}] the commit a branch, tag or commit is
    GET  /api/models/{org}/{name}/tree/{commit}         the commit's files (one page)
    HEAD /{org}/{name}/resolve/{commit}/{path}           X-Repo-Commit, ETag, Content-Length
    GET  /{org}/{name}/resolve/{commit}/{path}           the bytes

Errors carry the Hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound);
a private repo answers 401 without its token. Every request is logged (method, path),
and every answer's body bytes (`served`), so a test sees which files a download took and
how many bytes it cost.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_MIN_BYTES = 10_000_000     # larger files are served as LFS files (sha256 ETag), as the Hub does


@dataclass
class HubRepo:
    commits: dict[str, dict[str, Path | bytes]]   # commit -> path in repo -> a file's path or bytes
    refs: dict[str, str]                          # branch or tag -> commit
    token: str | None = None                      # private: the token it answers to


@dataclass
class HubServer:
    repos: dict[str, HubRepo]
    requests: list[tuple[str, str]] = field(default_factory=list)   # (method, path), in order
    served: list[tuple[str, int]] = field(default_factory=list)      # (path, bytes of the answer's body), in order
    _etags: dict = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "HubServer":
        hub = self

        class Handler(_Handler):
            server_hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloaded(self, repo_id: str) -> set[str]:
        """The files of `repo_id` whose bytes were fetched (GET .../resolve/<commit>/<path>)."""
        prefix = f"/{repo_id}/resolve/"
        return {unquote(path[len(prefix):]).split("/", 1)[1] for method, path in self.requests
                if method == "GET" and path.startswith(prefix)}

    def file_bytes(self, since: int = 0) -> dict[tuple[str, str], int]:
        """(repo id, file) -> bytes of it sent, over the answers from `served[since]` on:
        what a download took of each file (API answers and HEADs are left out)."""
        counted: dict[tuple[str, str], int] = {}
        for path, num_bytes in self.served[since:]:
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if len(parts) >= 5 and parts[2] == "resolve" and num_bytes:
                key = ("/".join(parts[:2]), "/".join(parts[4:]))
                counted[key] = counted.get(key, 0) + num_bytes
        return counted

    def entry(self, content: Path | bytes) -> tuple[bytes, str, str | None]:
        """(bytes, git blob sha1, sha256 for an LFS-sized file), computed once per content."""
        key = str(content) if isinstance(content, Path) else hashlib.sha1(content).hexdigest()
        if key not in self._etags:
            data = content.read_bytes() if isinstance(content, Path) else content
            git_sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            lfs = hashlib.sha256(data).hexdigest() if len(data) >= LFS_MIN_BYTES else None
            self._etags[key] = (git_sha, lfs, len(data))
        git_sha, lfs, _ = self._etags[key]
        data = content.read_bytes() if isinstance(content, Path) else content
        return data, git_sha, lfs


class _Handler(BaseHTTPRequestHandler):
    server_hub: HubServer

    def log_message(self, *args) -> None:   # the test reads `requests` instead
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        hub = self.server_hub
        path = urlparse(self.path).path
        hub.requests.append((self.command, path))
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and (len(parts) == 4 or len(parts) >= 6):
            repo_id = "/".join(parts[2:4])     # no revision: the default branch
            action, revision = (parts[4], "/".join(parts[5:])) if len(parts) > 4 else ("revision", "main")
            repo = self._repo(repo_id)
            commit = repo and self._commit(repo, revision)
            if commit and action == "revision":
                files = sorted(repo.commits[commit])
                self._json({"id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.token is not None,
                            "siblings": [{"rfilename": f} for f in files]})
            elif commit and action == "tree":
                self._json([self._tree_entry(name, content) for name, content in sorted(repo.commits[commit].items())])
            elif commit:
                self._error(404, "EntryNotFound", f"no such endpoint {action}")
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo("/".join(parts[:2]))
            commit = repo and self._commit(repo, parts[3])
            if commit:
                self._file(repo, commit, "/".join(parts[4:]), body)
            return
        self._error(404, "EntryNotFound", f"no route for {path}")

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.server_hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "RepoNotFound", "Invalid username or password.")
            return None
        return repo

    def _commit(self, repo: HubRepo, revision: str) -> str | None:
        commit = revision if revision in repo.commits else repo.refs.get(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _tree_entry(self, name: str, content: Path | bytes) -> dict:
        data, git_sha, lfs = self.server_hub.entry(content)
        entry = {"type": "file", "path": name, "size": len(data), "oid": git_sha}
        if lfs:
            entry["lfs"] = {"oid": lfs, "size": len(data), "pointerSize": 134}
        return entry

    def _file(self, repo: HubRepo, commit: str, name: str, body: bool) -> None:
        content = repo.commits[commit].get(name)
        if content is None:
            self._error(404, "EntryNotFound", f"{name} does not exist at {commit}")
            return
        data, git_sha, lfs = self.server_hub.entry(content)
        self.send_response(200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{lfs or git_sha}"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
            self._write(data)

    def _json(self, value) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self._write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self._write(data)

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.server_hub.served.append((urlparse(self.path).path, len(data)))   # list.append: safe across threads

