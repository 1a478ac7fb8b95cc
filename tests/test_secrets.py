"""The environment a credential-free child (a browser) gets: keys dropped by name and by value."""

from jaxagent import secrets


def test_scrubbed_environ_drops_secrets_by_name_and_value():
  env = {"PATH": "/usr/bin", "HOME": "/root", "OPENAI_API_KEY": "x" * 12, "HF_TOKEN": "hf_abc",
         "AWS_SECRET_ACCESS_KEY": "abc", "DB_PASSWORD": "pw", "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
         "MY_VAR": "sk-abcdefghijklmnop", "LANG": "C.UTF-8"}
  assert secrets.scrubbed_environ(env) == {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8"}


def test_a_registered_secret_is_dropped_under_any_name():
  secrets.register_secret("registered-value-123")
  assert secrets.scrubbed_environ({"HARMLESS": "registered-value-123", "OK": "1"}) == {"OK": "1"}
