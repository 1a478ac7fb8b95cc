"""The phone: a home screen ("launcher") that opens the apps, and a Settings app with toggles.

The device profile starts on the launcher and its `home` key returns there, as AitW's emulator does;
the Settings app gives the General-task analog (turn a setting on or off, checked on the server).
"""

from __future__ import annotations

from jaxagent.envs.sites.layout import Ctx, Redirect, esc, page

APPS = (("shop", "Shop", "#f2b33d", "S"), ("forum", "Forum", "#4caf7a", "F"), ("settings", "Settings", "#7a8699", "⚙"))
SETTING_LABELS = {"wifi": "Wi-Fi", "bluetooth": "Bluetooth", "dark_mode": "Dark mode",
                  "notifications": "Notifications", "location": "Location"}


def launcher(ctx: Ctx) -> str:
  icons = "".join(f"<a class=app id=app-{key} href='{ctx.url(f'{key}/')}' aria-label='{label}'>"
                  f"<span class=icon style='background:{colour}'>{icon}</span><span>{label}</span></a>"
                  for key, label, colour, icon in APPS)
  body = f"<div class=clock>09:41</div><nav class=apps aria-label=Apps>{icons}</nav>"
  return page(ctx, site="launcher", title="Home", body=body)


def settings(ctx: Ctx) -> str | Redirect | None:
  parts = ctx.path.strip("/").split("/") if ctx.path.strip("/") else []
  if ctx.method == "POST":
    if len(parts) == 2 and parts[0] == "toggle" and parts[1] in SETTING_LABELS:
      ctx.state.settings[parts[1]] = not ctx.state.settings[parts[1]]
      return Redirect(ctx.url("settings/"))
    return None
  if parts:
    return None
  rows = []
  for key, label in SETTING_LABELS.items():
    on = ctx.state.settings[key]
    rows.append(f"<tr><td>{esc(label)}</td><td id=value-{key}>{'On' if on else 'Off'}</td><td>"
                f"<form method=post action='{ctx.url(f'settings/toggle/{key}')}'><button type=submit id=toggle-{key} "
                f"aria-label='Turn {esc(label)} {'off' if on else 'on'}'>Turn {'off' if on else 'on'}</button>"
                f"</form></td></tr>")
  header = f"<header><a class=logo href='{ctx.url('settings/')}'>Settings</a></header>"
  body = (f"<h1>Settings</h1><table id=settings><thead><tr><th>Setting</th><th>State</th><th></th></tr></thead>"
          f"<tbody>{''.join(rows)}</tbody></table>")
  return page(ctx, site="settings", title="Settings", body=body, header=header)
