"""The forum: boards, paginated thread lists, threads with replies, user profiles and search.

Information seeking (who started a thread, how many replies it has), navigation (a user's profile, a
board's second page) and a state change (posting a reply, kept per session).
"""

from __future__ import annotations

import math

from jaxagent.envs.sites import catalog
from jaxagent.envs.sites.layout import Ctx, Redirect, esc, int_arg, page, pager, table

PER_PAGE = 15
ME = "you"  # the signed-in user who posts the episode's replies


def _replies(ctx: Ctx, thread: catalog.Thread) -> list[catalog.Post]:
  extra = [catalog.Post(author=r["author"], body=r["body"], day=901) for r in ctx.state.replies
           if r["thread_id"] == thread.id]
  return list(thread.posts) + extra


def _render(ctx: Ctx, title: str, body: str) -> str:
  header = (f"<header><a class=logo href='{ctx.url('forum/')}'>Agora</a>"
            f"<form role=search action='{ctx.url('forum/search')}' method=get>"
            f"<input type=search id=q name=q placeholder='Search threads' aria-label='Search threads' "
            f"value='{esc(ctx.query.get('q', '')) if ctx.path == 'search' else ''}'>"
            f"<button type=submit id=search-button>Search</button></form>"
            f"<span>Signed in as <a href='{ctx.url(f'forum/u/{ME}')}'>{ME}</a></span></header>")
  nav = "".join(f"<a href='{ctx.url(f'forum/b/{b}')}'>{esc(name)}</a>" for b, name in sorted(catalog.BOARDS.items()))
  return page(ctx, site="forum", title=f"{title} | Agora", body=body, header=header,
              nav=f"<nav class=cats aria-label=Boards>{nav}</nav>")


def _thread_rows(ctx: Ctx, threads: list[catalog.Thread]) -> list[tuple[str, ...]]:
  return [(f"<a class=thread-link href='{ctx.url(f'forum/t/{t.id}')}'>{esc(t.title)}</a>",
           f"<a href='{ctx.url(f'forum/u/{t.author}')}'>{esc(t.author)}</a>",
           str(len(_replies(ctx, t)) - 1), str(t.views)) for t in threads]


def home(ctx: Ctx) -> str:
  rows = []
  for b, name in sorted(catalog.BOARDS.items()):
    threads = [t for t in ctx.world.threads if t.board == b]
    rows.append((f"<a href='{ctx.url(f'forum/b/{b}')}'>{esc(name)}</a>", str(len(threads)),
                 str(sum(len(t.posts) for t in threads))))
  return _render(ctx, "Boards", f"<h1>Boards</h1>{table(('Board', 'Threads', 'Posts'), rows, 'boards')}")


def board(ctx: Ctx, b: str) -> str | None:
  if b not in catalog.BOARDS:
    return None
  threads = [t for t in ctx.world.threads if t.board == b]
  pages = max(1, math.ceil(len(threads) / PER_PAGE))
  k = int_arg(ctx.query.get("page"), 1, 1, pages)
  shown = threads[(k - 1) * PER_PAGE:k * PER_PAGE]
  body = (f"<h1>{esc(catalog.BOARDS[b])}</h1><p class=muted>{len(threads)} threads · page {k} of {pages}</p>"
          f"{table(('Thread', 'Started by', 'Replies', 'Views'), _thread_rows(ctx, shown), 'threads')}"
          f"{pager(ctx, f'forum/b/{b}', k, pages, {})}")
  return _render(ctx, catalog.BOARDS[b], body)


def thread(ctx: Ctx, tid: int) -> str | None:
  t = ctx.world.thread(tid)
  if t is None:
    return None
  posts = []
  for k, p in enumerate(_replies(ctx, t)):
    posts.append(f"<article class=post id=post-{k + 1}><div class=muted><a href='{ctx.url(f'forum/u/{p.author}')}'>"
                 f"{esc(p.author)}</a> · day {p.day}{' · original post' if k == 0 else ''}</div>"
                 f"<p>{esc(p.body)}</p></article>")
  form = (f"<form class=stack method=post action='{ctx.url(f'forum/t/{t.id}/reply')}'>"
          f"<label for=reply-body>Your reply</label><textarea id=reply-body name=body rows=3></textarea>"
          f"<p><button type=submit id=reply-submit>Post reply</button></p></form>")
  body = (f"<p class=muted><a href='{ctx.url(f'forum/b/{t.board}')}'>{esc(catalog.BOARDS[t.board])}</a></p>"
          f"<h1 id=thread-title>{esc(t.title)}</h1><p class=muted id=thread-stats>{len(posts) - 1} replies · "
          f"{t.views} views</p>{''.join(posts)}<h2>Reply</h2>{form}")
  return _render(ctx, t.title, body)


def user(ctx: Ctx, name: str) -> str | None:
  if name == ME:
    mine = [r for r in ctx.state.replies]
    body = f"<h1>{ME}</h1><p>You have posted {len(mine)} replies in this session.</p>"
    return _render(ctx, ME, body)
  u = ctx.world.users.get(name)
  if u is None:
    return None
  started = [t for t in ctx.world.threads if t.author == name]
  rows = [("Joined", f"day {u.joined_day}"), ("Location", esc(u.location)), ("Threads started", str(len(started)))]
  body = (f"<h1 id=user-name>{esc(u.name)}</h1>{table(('Field', 'Value'), rows, 'profile')}<h2>Threads</h2>"
          f"{table(('Thread', 'Started by', 'Replies', 'Views'), _thread_rows(ctx, started), 'user-threads')}")
  return _render(ctx, u.name, body)


def search(ctx: Ctx) -> str:
  q = ctx.query.get("q", "")
  found = catalog.search_threads(ctx.world, q)[:20]
  body = (f"<h1>Threads matching “{esc(q)}”</h1>" +
          (table(("Thread", "Started by", "Replies", "Views"), _thread_rows(ctx, found), "results") if found
           else "<p>No threads found.</p>"))
  return _render(ctx, f"Search: {q}", body)


def handle(ctx: Ctx) -> str | Redirect | None:
  parts = ctx.path.strip("/").split("/") if ctx.path.strip("/") else []
  if ctx.method == "POST":
    if len(parts) == 3 and parts[0] == "t" and parts[1].isdigit() and parts[2] == "reply":
      t = ctx.world.thread(int(parts[1]))
      if t is None:
        return None
      body = ctx.form.get("body", "").strip()
      if body:
        ctx.state.replies.append({"thread_id": t.id, "author": ME, "body": body})
      return Redirect(ctx.url(f"forum/t/{t.id}"))
    return None
  if not parts:
    return home(ctx)
  if parts == ["search"]:
    return search(ctx)
  if len(parts) == 2 and parts[0] == "b":
    return board(ctx, parts[1])
  if len(parts) == 2 and parts[0] == "t" and parts[1].isdigit():
    return thread(ctx, int(parts[1]))
  if len(parts) == 2 and parts[0] == "u":
    return user(ctx, parts[1])
  return None
