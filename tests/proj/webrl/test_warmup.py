"""The SFT's and the ORM's warm-up on short pages (`proj/webrl/warmup.py`)."""

from configs import webrl as webrl_config
from jaxagent.agents.webrl import WebRL, current_html
from jaxagent.proj.webrl import data, warmup
from jaxagent.types import Observation


def test_the_sft_warmup_trains_on_the_same_samples_with_short_pages_first(monkeypatch, tmp_path):
  config = webrl_config.get_config()
  config.sft.warmup.update(steps=7, prompt_chars=20)
  html = "<html> " + " ".join(f'<a id="{i}"> Link {i} </a>' for i in range(40)) + " </html>"
  prompt = WebRL().build_prompt("Open link 3", Observation(url="", html=html, intent="Open link 3"), [])
  items = [data.sample("t-1", prompt, 'do(action="Click", element="3")')]
  calls = []
  monkeypatch.setattr(warmup, "finetune", lambda cfg, out, its, **kw: calls.append((cfg, out, its, kw)))
  start = warmup.train(config, config.sft, "tok", items, data.cut_html, str(tmp_path / "warmup"))
  assert start == str(tmp_path / "warmup")
  (cfg, out, short, kw), = calls
  assert out == start and cfg.train.steps == 7 and cfg.data.tokenizer == "tok" and kw == {"init_from": None}
  assert short[0]["conversations"][1] == items[0]["conversations"][1]  # the reply unchanged
  assert current_html(short[0]["conversations"][0]["value"]) == html[:20]
  config.sft.warmup.steps = 0
  assert warmup.train(config, config.sft, "", items, data.cut_html, "off", init_from="W/sft") == "W/sft"
  assert len(calls) == 1
