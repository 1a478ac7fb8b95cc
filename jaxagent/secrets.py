"""API keys: read only from the environment or a key file, never stored in configs, and redacted.

A key is looked up at the moment a client is built (`load_api_key`), lives only inside that client, and
is registered here so that `redact` removes it from any text on its way to an error message, a log
line, a verdict reason or TensorBoard. Configs carry the *name* of the environment variable and the
*path* of a key file, never the key itself.
"""

from __future__ import annotations

import logging
import os
import re
import threading

REDACTED = "[REDACTED]"
_lock = threading.Lock()
_known: set[str] = set()
# Key-shaped strings redacted even when never registered (OpenAI, Anthropic, Google, bearer tokens).
_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"AIza[0-9A-Za-z_\-]{20,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}"),
    re.compile(r"(?i)(api[_-]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._\-]{8,}"),
]


def register_secret(value: str) -> None:
  """Redact `value` from every later `redact` call (short values are ignored: they would mangle text)."""
  if value and len(value) >= 6:
    with _lock:
      _known.add(value)


def redact(text: str) -> str:
  """`text` with every registered secret and every key-shaped string replaced by [REDACTED]."""
  if not text:
    return text
  with _lock:
    known = sorted(_known, key=len, reverse=True)
  for secret in known:
    text = text.replace(secret, REDACTED)
  for pattern in _PATTERNS:
    text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
  return text


def load_api_key(env_var: str = "OPENAI_API_KEY", key_file: str = "") -> str | None:
  """The key from `$env_var`, else from `key_file` (first line); None when neither is set.

  Raises ValueError naming the file when a key file is configured but unreadable or empty, so a typo in
  a path is not mistaken for "no key".
  """
  key = os.environ.get(env_var, "").strip() if env_var else ""
  if not key and key_file:
    path = os.path.expanduser(key_file)
    try:
      with open(path, encoding="utf-8") as f:
        key = f.readline().strip()
    except OSError as e:
      raise ValueError(f"api key file {key_file!r} cannot be read ({e.strerror}); fix the path in the config's "
                       f"api_key_file or set ${env_var}") from None
    if not key:
      raise ValueError(f"api key file {key_file!r} is empty; put the key on its first line or set ${env_var}")
  if key:
    register_secret(key)
    return key
  return None


# Environment variables a child that needs no credentials (a browser) must not inherit: by name, or by value.
_SECRET_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE)")


def scrubbed_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
  """`environ` (default `os.environ`) without the variables that name or hold a secret: names like *_API_KEY,
  *_TOKEN, *SECRET*, *PASSWORD*, *CREDENTIALS*, *AUTH*, *COOKIE*, and any value that is a registered or
  key-shaped secret. What a browser gets, so `/proc/<pid>/environ` of Chromium holds no key."""
  environ = dict(os.environ if environ is None else environ)
  return {k: v for k, v in environ.items() if not _SECRET_NAME.search(k) and redact(v) == v}


class RedactingFilter(logging.Filter):
  """A logging filter that redacts secrets from records (attach it to handlers that may see errors)."""

  def filter(self, record: logging.LogRecord) -> bool:
    record.msg = redact(record.getMessage())
    record.args = ()
    return True
