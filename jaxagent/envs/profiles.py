"""Browser profiles: the viewport, input modality and screenshot policy of one kind of agent.

- `web`: WebVoyager's desktop window, 1024x768 at device scale 1 (`reference/algorithms.md` §1.2).
- `device`: a phone (412x915 CSS px, Pixel-7-like, scale 2.625, touch). The AitW action space of DigiRL / Digi-Q
  (§4.3) acts on it through taps and swipes at screen points plus back / home / enter.
- `text`: the desktop window without screenshots (accessibility-tree or HTML-only agents; cheaper).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Profile:
  name: str
  width: int  # viewport, CSS px
  height: int
  device_scale_factor: float = 1.0
  is_mobile: bool = False
  has_touch: bool = False
  screenshot: bool = True
  user_agent: str | None = None

  def context_options(self) -> dict:
    """Keyword arguments for Playwright's `Browser.new_context`."""
    opts = dict(
        viewport={"width": self.width, "height": self.height},
        device_scale_factor=self.device_scale_factor,
        is_mobile=self.is_mobile,
        has_touch=self.has_touch,
    )
    if self.user_agent:
      opts["user_agent"] = self.user_agent
    return opts


_PHONE_UA = ("Mozilla/5.0 (Linux; Android 14; Pixel 7) AppleWebKit/537.36 (KHTML, like Gecko) "
             "Chrome/124.0.0.0 Mobile Safari/537.36")

PROFILES: dict[str, Profile] = {
    "web": Profile("web", 1024, 768),
    "device": Profile("device", 412, 915, device_scale_factor=2.625, is_mobile=True, has_touch=True,
                      user_agent=_PHONE_UA),
    "text": Profile("text", 1024, 768, screenshot=False),
}


def get_profile(profile: str | Profile) -> Profile:
  if isinstance(profile, Profile):
    return profile
  try:
    return PROFILES[profile]
  except KeyError:
    raise ValueError(f"profile={profile!r} is not a known profile; use one of {sorted(PROFILES)} "
                     "or pass a jaxagent.envs.profiles.Profile") from None
