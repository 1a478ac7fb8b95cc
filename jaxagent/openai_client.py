"""One way to ask an OpenAI-compatible chat model, shared by the LLM judges and `policies.OpenAIPolicy`.

So that judging and acting retry, count and guard keys alike:
  * retries with exponential backoff (honouring Retry-After) on 429, 5xx, timeouts, connection errors,
    malformed bodies (not JSON, no `choices`, null content, an HTML page) and empty replies (content that is
    blank); other 4xx fail at once. The `openai` client's own retries are off, so every attempt shows in
    `stats` (retries by cause, requests given up by last cause);
  * time is bounded by the wall clock, not per read: each attempt is abandoned after `timeout_s` (a server
    that trickles a byte at a time cannot hold it), and the whole call, retries and backoff included, ends by
    `deadline_s`;
  * tokens and cost are counted;
  * an optional content-keyed on-disk cache (sha256 of model + messages + sampling) makes asking again free.
    Only a usable reply is cached: never a blank one, nor one the caller's `keep` refuses (a judge keeps only
    replies that hold a verdict), so asking again later asks the server again. A cache file that is not an
    entry (torn, truncated, another shape, or an entry the caller would not keep) is a miss, logged with its
    path, and is overwritten by the next good reply; a cache that cannot be written costs the cache, not the
    reply;
  * the key is looked up when the client is first used, from `$api_key_env` or `api_key_file`
    (`secrets.load_api_key`), never from a config value, and every error text passes `secrets.redact`.
A reply that cannot be had raises `CompletionUnavailable` with the redacted reason: no fault of the server or of the
cache raises anything else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import numbers
import os
import random
import tempfile
import threading
import time
from typing import Any, Callable, NoReturn, TypeVar

from jaxagent import secrets
from jaxagent.agents import base as fmt_base

_Config = TypeVar("_Config")
log = logging.getLogger(__name__)


# The numeric settings of the configs built on this client (client, LLM judge, OpenAI policy, ...): key -> (type,
# least value, whether the least value itself is allowed, what the key means).
_SETTINGS = {
    "timeout_s": (float, 0, False, "seconds one HTTP attempt may take"),
    "deadline_s": (float, 0, True, "seconds a request may take with its retries; 0 means 4 × timeout_s"),
    "max_retries": (int, 0, True, "attempts after the first"),
    "backoff_initial_s": (float, 0, True, "seconds before the first retry"),
    "backoff_max_s": (float, 0, True, "the longest wait between retries"),
    "concurrency": (int, 1, True, "requests in flight at once"),
    "max_tokens": (int, 1, True, "the longest reply, in tokens"),
    "max_attached_imgs": (int, 1, True, "screenshots attached to a request"),
    "temperature": (float, 0, True, "the sampling temperature"),
}


def _setting_ok(value: Any, kind: type, least: float, inclusive: bool) -> bool:
  """Whether `value` is a `kind` (an integer passes as a number; a bool, a string or NaN is neither) at or above
  `least`."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral if kind is int else numbers.Real):
    return False
  return value >= least if inclusive else value > least


def check_settings(cls: type, values: dict[str, Any], what: str) -> None:
  """Refuses a numeric setting of `_SETTINGS` among `values` (the fields of the config dataclass `cls`) of the wrong
  type or range, naming `what`, the key and the fix: a bad value would otherwise fail only at the first request,
  or hang there."""
  for key, (kind, least, inclusive, meaning) in _SETTINGS.items():
    if key in values and not _setting_ok(values[key], kind, least, inclusive):
      rule = f"{'an integer' if kind is int else 'a number'} {'>=' if inclusive else '>'} {least}"
      default = next(f.default for f in dataclasses.fields(cls) if f.name == key)
      raise ValueError(f"{what}: {key}={values[key]!r} must be {rule} ({meaning}); set {key}={default!r} (the "
                       "default) or another such value")


def config_from(cls: type[_Config], cfg: Any, what: str) -> _Config:
  """`cls` (a config dataclass) from a dict or ml_collections ConfigDict; unknown keys and values a request cannot
  run with (`check_settings`) are an error naming the key (`what` names the config in it)."""
  d = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"{what}: unknown key(s) {unknown}; valid keys are {sorted(names)}")
  check_settings(cls, d, what)
  return cls(**d)


@dataclasses.dataclass
class ClientConfig:
  """Where and how to ask. No key in here: `api_key_env` / `api_key_file` say where to find it."""

  base_url: str = ""  # "" -> $OPENAI_BASE_URL or the OpenAI API
  model: str = "gpt-4o"
  api_key_env: str = "OPENAI_API_KEY"
  api_key_file: str = ""
  max_tokens: int = 1000
  temperature: float = 0.0
  top_p: float | None = None  # None: not sent (the server's default)
  seed: int | None = 42
  timeout_s: float = 60.0  # wall-clock limit of one HTTP attempt (not per read)
  deadline_s: float = 0.0  # wall-clock limit of a whole request, retries and backoff included; 0 -> 4 × timeout_s
  max_retries: int = 6
  backoff_initial_s: float = 1.0
  backoff_max_s: float = 30.0
  cache_dir: str = ""  # "" -> no cache
  image_root: str = ""  # where relative image paths in the messages resolve
  usd_per_1k_prompt: float = 0.01  # WebVoyager's cost log
  usd_per_1k_completion: float = 0.03

  def __post_init__(self):
    check_settings(type(self), vars(self), type(self).__name__)

  @classmethod
  def like(cls, config: Any) -> "ClientConfig":
    """The fields a judge's or a policy's config shares with this one; the others keep their defaults."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if hasattr(config, f.name)})


class CompletionUnavailable(Exception):
  """No usable reply could be obtained (the reason is already redacted)."""


@dataclasses.dataclass
class UsageStats:
  requests: int = 0  # completions asked for (cache hits included)
  cache_hits: int = 0
  api_calls: int = 0  # HTTP attempts, retries included
  retries: dict[str, int] = dataclasses.field(default_factory=dict)  # by cause: "429", "5xx", "timeout", "empty"...
  failures: dict[str, int] = dataclasses.field(default_factory=dict)  # requests given up, by last cause
  prompt_tokens: int = 0
  completion_tokens: int = 0
  cost_usd: float = 0.0

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class OpenAIClient:
  """Thread-safe completions with the retries, accounting and cache of the module docstring.

  `client`: an `openai.OpenAI`-like object to use instead of building one. `stats`: where to count (a subclass
  of `UsageStats` with more fields, counted with `count`, is fine). `owner` names the config in the hint given
  when a request is refused and no key was found.
  """

  def __init__(self, config: ClientConfig, client: Any = None, stats: UsageStats | None = None,
               owner: str = "client"):
    self.config = config
    self.stats = stats if stats is not None else UsageStats()
    self.owner = owner
    self._client = client
    self._had_key = True
    self._client_lock = threading.Lock()
    self._stats_lock = threading.Lock()
    self._rng = random.Random(0)

  def client(self):
    with self._client_lock:
      if self._client is None:
        import openai  # pylint: disable=g-import-not-at-top

        key = secrets.load_api_key(self.config.api_key_env, self.config.api_key_file)
        self._had_key = key is not None
        base_url = self.config.base_url or os.environ.get("OPENAI_BASE_URL") or None
        self._client = openai.OpenAI(api_key=key or "EMPTY", base_url=base_url, timeout=self.config.timeout_s,
                                     max_retries=0)  # retries are ours, so they show in the stats
      return self._client

  def count(self, field: str, key: str | None = None, n: float = 1) -> None:
    """Adds `n` to `stats.<field>`, or to its entry `key` when the field is a dict."""
    with self._stats_lock:
      if key is None:
        setattr(self.stats, field, getattr(self.stats, field) + n)
      else:
        d = getattr(self.stats, field)
        d[key] = d.get(key, 0) + int(n)

  # ---- cache
  def _request(self, messages: list[fmt_base.Message]) -> dict[str, Any]:
    request = {"model": self.config.model, "messages": fmt_base.to_openai_messages(messages, self.config.image_root),
               "max_tokens": self.config.max_tokens, "temperature": self.config.temperature, "seed": self.config.seed}
    if self.config.top_p is not None:  # only when set, so the cache keys of requests without it stay the same
      request["top_p"] = self.config.top_p
    return request

  def _cache_path(self, request: dict[str, Any]) -> str | None:
    if not self.config.cache_dir:
      return None
    key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    return os.path.join(self.config.cache_dir, key[:2], key + ".json")

  def _read_cache(self, path: str | None, keep: Callable[[str], bool] | None) -> str | None:
    """The cached reply at `path`, or None: a missing file is a miss; so is one that is not a usable entry
    (logged with its path; the next good reply overwrites it)."""
    if path is None or not os.path.exists(path):
      return None
    try:
      with open(path, encoding="utf-8") as f:
        entry = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # torn, truncated, not UTF-8, a directory, ...
      log.warning("%s: unreadable cache entry %s (%s); asking again", self.owner, path, type(e).__name__)
      return None
    content = entry.get("content") if isinstance(entry, dict) else None
    if not isinstance(content, str) or not content.strip():
      log.warning("%s: cache entry %s is not an entry with a reply (%s); asking again", self.owner, path,
                  type(entry).__name__ if not isinstance(entry, dict) else "content " + type(content).__name__)
      return None
    if keep is not None and not _kept(keep, content):
      log.warning("%s: cache entry %s holds a reply the caller does not keep; asking again", self.owner, path)
      return None
    return content

  def _write_cache(self, path: str | None, entry: dict[str, Any]) -> None:
    """Writes atomically (readers see the old file or the whole new one); a failure loses the entry only."""
    if path is None:
      return
    tmp = None
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entry, f)
      os.replace(tmp, path)
    except OSError as e:
      log.warning("%s: cannot write cache entry %s (%s: %s); the reply is used uncached", self.owner, path,
                  type(e).__name__, e)
      if tmp is not None and os.path.exists(tmp):
        try:
          os.remove(tmp)
        except OSError:
          pass

  # ---- one completion, with retries
  def complete(self, messages: list[fmt_base.Message], keep: Callable[[str], bool] | None = None) -> str:
    """The model's reply text; raises `CompletionUnavailable` (redacted reason) when none can be had.

    A blank reply is no reply (retried, then given up). `keep(reply)` says whether a reply may be cached (and a
    cached one used); a reply it refuses is still returned, uncached, so the caller can show it and a later
    call asks again. It is not retried: a model's own answer would most likely come back the same.
    """
    request = self._request(messages)
    self.count("requests")
    path = self._cache_path(request)
    cached = self._read_cache(path, keep)
    if cached is not None:
      self.count("cache_hits")
      return cached
    start = time.monotonic()
    budget = self.config.deadline_s if self.config.deadline_s > 0 else 4 * self.config.timeout_s
    deadline = start + budget
    cause, detail, attempts = "", "", 0
    for attempt in range(self.config.max_retries + 1):
      if attempt:
        delay = self._backoff(attempt, detail)
        if time.monotonic() + delay >= deadline:
          return self._give_up(cause, f"gave up after {attempts} attempts at the {budget:g} s deadline; last "
                                      f"error {cause}: {detail}")
        self.count("retries", cause)
        time.sleep(delay)
      self.count("api_calls")
      attempts += 1
      try:
        resp = self._attempt(request, min(self.config.timeout_s, deadline - time.monotonic()))
        content = resp.choices[0].message.content
        if not isinstance(content, str):
          raise TypeError(f"message.content is {type(content).__name__}")
        if not content.strip():
          raise _BlankReply(f"message.content is blank: {content!r}")
      except Exception as e:  # pylint: disable=broad-except
        cause, retryable, detail = _classify(e)
        if not retryable:
          hint = "" if self._had_key or cause != "http_401" else (
              f" (no API key was found: set ${self.config.api_key_env} or the {self.owner} config's api_key_file)")
          return self._give_up(cause, f"{cause}: {e}{hint}")
        continue
      usage = getattr(resp, "usage", None)
      prompt_tokens = _int(getattr(usage, "prompt_tokens", 0))
      completion_tokens = _int(getattr(usage, "completion_tokens", 0))
      self.count("prompt_tokens", n=prompt_tokens)
      self.count("completion_tokens", n=completion_tokens)
      self.count("cost_usd", n=prompt_tokens / 1000 * self.config.usd_per_1k_prompt
                 + completion_tokens / 1000 * self.config.usd_per_1k_completion)
      if keep is None or _kept(keep, content):
        self._write_cache(path, {"content": content, "prompt_tokens": prompt_tokens,
                                 "completion_tokens": completion_tokens, "model": self.config.model})
      return content
    return self._give_up(cause, f"gave up after {attempts} attempts; last error {cause}: {detail}")

  def _give_up(self, cause: str, reason: str) -> NoReturn:
    self.count("failures", cause)
    raise CompletionUnavailable(secrets.redact(reason)) from None

  def _attempt(self, request: dict[str, Any], timeout: float) -> Any:
    """One HTTP attempt, abandoned after `timeout` s of wall-clock time.

    The `openai` client's timeout bounds each read, so a server that trickles bytes holds it for as long as it
    likes; the attempt runs on a daemon thread instead and is left behind at the deadline (the client's own
    per-read timeout still ends it once the server stalls or the reply is in; its result is dropped).
    """
    if timeout <= 0:
      raise _AttemptTimeout("no time left before the deadline")
    client = self.client()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run():
      try:
        box["resp"] = client.chat.completions.create(**request)
      except BaseException as e:  # pylint: disable=broad-except
        box["error"] = e
      finally:
        done.set()

    threading.Thread(target=run, name="openai-attempt", daemon=True).start()
    if not done.wait(timeout):
      raise _AttemptTimeout(f"no complete reply within {timeout:.3g} s (wall clock)")
    if "error" in box:
      raise box["error"]
    return box["resp"]

  def _backoff(self, attempt: int, retry_after: str) -> float:
    delay = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** (attempt - 1))
    if retry_after.startswith("retry-after="):
      try:
        delay = min(self.config.backoff_max_s, max(delay, float(retry_after.split("=", 1)[1])))
      except ValueError:
        pass
    with self._stats_lock:
      jitter = self._rng.uniform(0, 0.25 * delay)
    return delay + jitter


class _AttemptTimeout(Exception):
  """An attempt ran past its wall-clock limit and was abandoned."""


class _BlankReply(Exception):
  """A well-formed completion whose text is blank: no reply (retried, never cached)."""


def _kept(keep: Callable[[str], bool], content: str) -> bool:
  """`keep(content)`; a `keep` that raises keeps nothing (the reply is still returned)."""
  try:
    return bool(keep(content))
  except Exception:  # pylint: disable=broad-except
    log.warning("keep(%r...) raised; the reply is not cached", content[:40], exc_info=True)
    return False


def _int(value: Any) -> int:
  try:
    return int(value or 0)
  except (TypeError, ValueError):  # a usage block of another shape counts nothing
    return 0


def _classify(e: Exception) -> tuple[str, bool, str]:
  """(cause, retryable, detail) of a failed call. `detail` carries Retry-After when the server sent one."""
  import openai  # pylint: disable=g-import-not-at-top

  if isinstance(e, _AttemptTimeout):
    return "timeout", True, str(e)
  if isinstance(e, _BlankReply):
    return "empty", True, str(e)
  if isinstance(e, openai.APITimeoutError):
    return "timeout", True, str(e)
  if isinstance(e, openai.APIConnectionError):
    return "connection", True, str(e)
  if isinstance(e, openai.APIStatusError):
    status = e.status_code
    retry_after = ""
    try:
      retry_after = e.response.headers.get("retry-after", "")
    except Exception:  # pylint: disable=broad-except
      pass
    detail = f"retry-after={retry_after}" if retry_after else str(e)
    if status == 429:
      return "429", True, detail
    if status >= 500:
      return "5xx", True, detail
    return f"http_{status}", False, str(e)
  if isinstance(e, (openai.APIResponseValidationError, ValueError, TypeError, KeyError, IndexError, AttributeError)):
    return "malformed", True, f"{type(e).__name__}: {e}"
  return type(e).__name__, False, str(e)
