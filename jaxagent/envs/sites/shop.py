"""The shop: the analog of AitW Web Shopping and WebArena's shopping site.

Catalogue with categories, keyword search with ranking, filters and sort (links, so touch agents can use
them), product pages with colour/size options, a cart, a checkout form and order history. A cookie banner
covers the bottom of every page until it is accepted, as on the real web. A perturbed episode (`perturb.py`)
moves the category bar and the sort control, shuffles lists, changes the page size and may offer a risky deal.
"""

from __future__ import annotations

import math

from jaxagent.envs.sites import catalog, perturb
from jaxagent.envs.sites.layout import Ctx, Redirect, esc, int_arg, page, pager, table

SORTS = {"relevance": "Relevance", "price_asc": "Price: low to high", "price_desc": "Price: high to low",
         "rating": "Customer rating", "reviews": "Most reviews"}


def _money(cents: int) -> str:
  return f"${cents // 100}.{cents % 100:02d}"


def sorted_products(products: list[catalog.Product], sort: str) -> list[catalog.Product]:
  if sort == "price_asc":
    return sorted(products, key=lambda p: (p.price_cents, p.id))
  if sort == "price_desc":
    return sorted(products, key=lambda p: (-p.price_cents, p.id))
  if sort == "rating":
    return sorted(products, key=lambda p: (-p.rating, p.id))
  if sort == "reviews":
    return sorted(products, key=lambda p: (-p.reviews, p.id))
  return products


def _header(ctx: Ctx) -> str:
  n = sum(item["qty"] for item in ctx.state.cart)
  q = esc(ctx.query.get("q", "")) if ctx.path == "search" else ""
  return (f"<header><a class=logo href='{ctx.url('shop/')}'>Shoply</a>"
          f"<form role=search action='{ctx.url('shop/search')}' method=get>"
          f"<input type=search id=q name=q placeholder='Search products' aria-label='Search products' value='{q}'>"
          f"<button type=submit id=search-button>Search</button></form>"
          f"<a id=cart-link href='{ctx.url('shop/cart')}'>Cart ({n})</a>"
          f"<a id=orders-link href='{ctx.url('shop/orders')}'>Orders</a></header>")


def _pert(ctx: Ctx):
  return ctx.state.perturbation


def _nav(ctx: Ctx) -> str:
  cats = _pert(ctx).shuffled(sorted(catalog.CATEGORIES), "categories")
  links = "".join(f"<a href='{ctx.url(f'shop/c/{c}')}'>{c.title()}</a>" for c in cats)
  style = " style='flex-direction:column'" if _pert(ctx).layout_variant[0] == 2 else ""
  return f"<nav class=cats aria-label=Categories{style}>{links}</nav>"


def _banner(ctx: Ctx) -> str:
  if ctx.state.cookie_consent:
    return ""
  here = ctx.url(f"shop/{ctx.path}", **ctx.query)
  return (f"<div id=cookie-banner role=dialog aria-label='Cookie consent'><p>We use cookies to keep your cart and "
          f"to improve the shop. You can change this at any time.</p>"
          f"<form method=post action='{ctx.url('shop/consent')}'><input type=hidden name=next value='{esc(here)}'>"
          f"<button type=submit id=cookie-accept>Accept cookies</button></form></div>")


def _render(ctx: Ctx, title: str, body: str) -> str:
  where = perturb.NAV_VARIANTS[_pert(ctx).layout_variant[0]]
  if where == "bottom":
    return page(ctx, site="shop", title=f"{title} | Shoply", body=body + _nav(ctx), header=_header(ctx),
                extra=_banner(ctx))
  if where == "side":
    body = f"<div class=layout>{_nav(ctx)}<div class=content>{body}</div></div>"
    return page(ctx, site="shop", title=f"{title} | Shoply", body=body, header=_header(ctx), extra=_banner(ctx))
  return page(ctx, site="shop", title=f"{title} | Shoply", body=body, header=_header(ctx), nav=_nav(ctx),
              extra=_banner(ctx))


def _card(ctx: Ctx, p: catalog.Product) -> str:
  return (f"<div class=card><a class=name href='{ctx.url(f'shop/p/{p.id}')}'>{esc(p.name)}</a>"
          f"<div class=price>{p.price}</div><div class=muted>{p.rating} / 5 · {p.reviews} reviews</div></div>")


def _sort_links(ctx: Ctx, site_path: str, params: dict[str, str], current: str) -> str:
  if perturb.SORT_VARIANTS[_pert(ctx).layout_variant[1]] == "list":
    items = [f"<li><strong>{label}</strong></li>" if key == current else
             f"<li><a href='{esc(ctx.url(site_path, **params, sort=key))}'>{label}</a></li>"
             for key, label in SORTS.items()]
    return f"<div class=sort-list aria-label='Sort by'><h3>Sort by</h3><ul>{''.join(items)}</ul></div>"
  chips = []
  for key, label in SORTS.items():
    if key == current:
      chips.append(f"<span class=on>{label}</span>")
    else:
      chips.append(f"<a href='{esc(ctx.url(site_path, **params, sort=key))}'>{label}</a>")
  return f"<div class=chips aria-label='Sort by'>Sort: {''.join(chips)}</div>"


def _listing(ctx: Ctx, sort_control: str, grid: str) -> str:
  """The sort control above the grid (today's chips), below it, or (the list variant) nowhere: the caller puts
  the list in the sidebar."""
  where = perturb.SORT_VARIANTS[_pert(ctx).layout_variant[1]]
  if where == "below":
    return grid + sort_control
  return sort_control + grid


def _paged(ctx: Ctx, items: list, site_path: str, params: dict[str, str]) -> tuple[list, str]:
  per_page = _pert(ctx).page_size
  pages = max(1, math.ceil(len(items) / per_page))
  k = int_arg(ctx.query.get("page"), 1, 1, pages)
  return items[(k - 1) * per_page:k * per_page], pager(ctx, site_path, k, pages, params)


def home(ctx: Ctx) -> str:
  top = sorted(ctx.world.products, key=lambda p: (-p.rating, -p.reviews, p.id))[:8]
  cats = "".join(f"<div class=card><a class=name href='{ctx.url(f'shop/c/{c}')}'>{c.title()}</a>"
                 f"<div class=muted>{', '.join(kinds[:3])} and more</div></div>"
                 for c, kinds in sorted(catalog.CATEGORIES.items()))
  deal = ""
  if _pert(ctx).has_deal:
    deal = (f"<div class=notice id=deal-banner><a id=deal href='{ctx.url('shop/deal')}'>Deal for you: "
            f"{esc(_pert(ctx).shortcut_label or 'today only')} →</a></div>")
  body = (f"{deal}<h1>Welcome to Shoply</h1><h2>Shop by category</h2><div class=grid>{cats}</div>"
          f"<h2>Top rated</h2><div class=grid>{''.join(_card(ctx, p) for p in top)}</div>")
  return _render(ctx, "Home", body)


def deal(ctx: Ctx) -> str | Redirect | None:
  """P5, the risky shortcut: the deal reaches the task's target listing or has expired, drawn once per episode."""
  pert = _pert(ctx)
  if not pert.has_deal:
    return None
  if pert.deal_works:
    return Redirect(ctx.root + pert.shortcut)
  body = (f"<h1>This deal has expired</h1><p>Sorry, the offer you followed is no longer available.</p>"
          f"<p><a id=deal-home href='{ctx.url('shop/')}'>Continue shopping</a></p>")
  return _render(ctx, "Deal expired", body)


def category(ctx: Ctx, cat: str) -> str | None:
  if cat not in catalog.CATEGORIES:
    return None
  brand, colour = ctx.query.get("brand", ""), ctx.query.get("colour", "")
  sort = ctx.query.get("sort", "relevance")
  sort = sort if sort in SORTS else "relevance"
  items = [p for p in ctx.world.products if p.category == cat]
  brands = _pert(ctx).shuffled(sorted({p.brand for p in items}), "brands")
  if brand:
    items = [p for p in items if p.brand == brand]
  if colour:
    items = [p for p in items if colour in p.colours]
  items = sorted_products(items, sort) if sort != "relevance" else _pert(ctx).shuffled(items, f"listing/{cat}")
  path = f"shop/c/{cat}"
  params = {"brand": brand, "colour": colour, "sort": sort if sort != "relevance" else ""}
  shown, pages = _paged(ctx, items, path, params)

  def filt(key: str, values, current: str) -> str:
    lis = [f"<li><a href='{esc(ctx.url(path, **{**params, key: ''}))}'>All</a></li>"] if current else []
    for v in values:
      if v == current:
        lis.append(f"<li><strong>{esc(v)}</strong></li>")
      else:
        lis.append(f"<li><a class=filter-{key} href='{esc(ctx.url(path, **{**params, key: v}))}'>{esc(v)}</a></li>")
    return f"<h3>{key.title()}</h3><ul>{''.join(lis)}</ul>"

  colours = _pert(ctx).shuffled(catalog.COLOURS, "colours")
  sort_control = _sort_links(ctx, path, {k: v for k, v in params.items() if k != "sort"}, sort)
  in_aside = perturb.SORT_VARIANTS[_pert(ctx).layout_variant[1]] == "list"
  aside = (f"<aside aria-label=Filters>{sort_control if in_aside else ''}{filt('brand', brands, brand)}"
           f"{filt('colour', colours, colour)}</aside>")
  grid = f"<div class=grid>{''.join(_card(ctx, p) for p in shown)}</div>"
  listing = (f"<h1>{cat.title()}</h1><p class=muted>{len(items)} products</p>"
             f"{_listing(ctx, '' if in_aside else sort_control, grid)}{pages}")
  return _render(ctx, cat.title(), f"<div class=layout>{aside}<div class=content>{listing}</div></div>")


def search(ctx: Ctx) -> str:
  q = ctx.query.get("q", "")
  sort = ctx.query.get("sort", "relevance")
  sort = sort if sort in SORTS else "relevance"
  items = sorted_products(catalog.search_products(ctx.world, q), sort)
  params = {"q": q, "sort": sort if sort != "relevance" else ""}
  shown, pages = _paged(ctx, items, "shop/search", params)
  grid = f"<div class=grid>{''.join(_card(ctx, p) for p in shown)}</div>"
  if not items:
    body = f"<h1>No results for “{esc(q)}”</h1><p>Check the spelling or try a shorter query.</p>"
  else:
    body = (f"<h1>Results for “{esc(q)}”</h1><p class=muted>{len(items)} products</p>"
            f"{_listing(ctx, _sort_links(ctx, 'shop/search', {'q': q}, sort), grid)}{pages}")
  return _render(ctx, f"Search: {q}", body)


def product(ctx: Ctx, pid: int) -> str | None:
  p = ctx.world.product(pid)
  if p is None:
    return None
  colour = ctx.query.get("colour") if ctx.query.get("colour") in p.colours else p.colours[0]
  size = ctx.query.get("size") if ctx.query.get("size") in p.sizes else ""

  def chips(key: str, values, current: str) -> str:
    out = []
    for v in values:
      if v == current:
        out.append(f"<span class=on aria-current=true>{esc(v)}</span>")
      else:
        href = ctx.url(f"shop/p/{p.id}", colour=colour if key != "colour" else v, size=size if key != "size" else v)
        out.append(f"<a class=opt-{key} href='{esc(href)}'>{esc(v)}</a>")
    return f"<div class=chips id=opt-{key}>{key.title()}: {''.join(out)}</div>"

  specs = table(("Attribute", "Value"), [
      ("Brand", esc(p.brand)), ("Category", esc(p.category.title())), ("Type", esc(p.kind)),
      ("Colours", esc(", ".join(p.colours))), ("Sizes", esc(", ".join(p.sizes) or "one size")),
      ("Rating", f"{p.rating} / 5"), ("Reviews", str(p.reviews)), ("In stock", str(p.stock))], table_id="specs")
  error = "<div class=error id=size-error>Please choose a size first.</div>" if ctx.query.get("err") == "size" else ""
  form = (f"<form method=post action='{ctx.url('shop/cart/add')}'><input type=hidden name=product_id value={p.id}>"
          f"<input type=hidden name=colour value='{esc(colour)}'><input type=hidden name=size value='{esc(size)}'>"
          f"<input type=hidden name=qty value=1>"
          f"<button type=submit id=add-to-cart>Add to cart</button></form>")
  body = (f"{error}<h1 id=product-name>{esc(p.name)}</h1><div class=price id=price>{p.price}</div>"
          f"<p class=muted>{p.rating} out of 5 stars · {p.reviews} reviews</p><p>{esc(p.description)}</p>"
          f"{chips('colour', p.colours, colour)}{chips('size', p.sizes, size) if p.sizes else ''}"
          f"<p>{form}</p><h2>Specifications</h2>{specs}")
  return _render(ctx, p.name, body)


def cart(ctx: Ctx) -> str:
  rows, total = [], 0
  for k, item in enumerate(ctx.state.cart):
    p = ctx.world.product(item["product_id"])
    total += p.price_cents * item["qty"]
    remove = (f"<form method=post action='{ctx.url('shop/cart/remove')}'><input type=hidden name=index value={k}>"
              f"<button type=submit class=remove>Remove</button></form>")
    rows.append((f"<a href='{ctx.url(f'shop/p/{p.id}')}'>{esc(p.name)}</a>", esc(item["colour"]),
                 esc(item["size"] or "-"), str(item["qty"]), p.price, remove))
  if not rows:
    body = "<h1>Your cart</h1><p id=cart-empty>Your cart is empty.</p>"
  else:
    body = (f"<h1>Your cart</h1>{table(('Product', 'Colour', 'Size', 'Qty', 'Price', ''), rows, 'cart')}"
            f"<p>Total: <strong id=cart-total>{_money(total)}</strong></p>"
            f"<p><a class=btn id=checkout href='{ctx.url('shop/checkout')}'>Proceed to checkout</a></p>")
  return _render(ctx, "Cart", body)


def checkout(ctx: Ctx) -> str | Redirect:
  if ctx.method == "POST":
    name, address = ctx.form.get("name", "").strip(), ctx.form.get("address", "").strip()
    if not ctx.state.cart or not name or not address:
      missing = "Your cart is empty." if not ctx.state.cart else "Please fill in your name and address."
      return _checkout_form(ctx, missing, name, address, ctx.form.get("shipping", "standard"))
    oid = 1000 + len(ctx.state.orders) + 1
    total = sum(ctx.world.product(i["product_id"]).price_cents * i["qty"] for i in ctx.state.cart)
    ctx.state.orders.append({"id": oid, "items": [dict(i) for i in ctx.state.cart], "name": name,
                             "address": address, "shipping": ctx.form.get("shipping", "standard"),
                             "total_cents": total})
    ctx.state.cart.clear()
    return Redirect(ctx.url(f"shop/orders/{oid}"))
  return _checkout_form(ctx, "")


def _checkout_form(ctx: Ctx, error: str, name: str = "", address: str = "", shipping: str = "standard") -> str:
  """On an error the typed and chosen values stay, as on real shops (an Enter in one field submits the form
  early)."""
  express = shipping == "express"
  err = f"<div class=error id=checkout-error>{esc(error)}</div>" if error else ""
  body = (f"<h1>Checkout</h1>{err}<form class=stack method=post action='{ctx.url('shop/checkout')}'>"
          f"<label for=name>Full name</label><input type=text id=name name=name autocomplete=off value='{esc(name)}'>"
          f"<label for=address>Shipping address</label><input type=text id=address name=address autocomplete=off value='{esc(address)}'>"
          f"<fieldset><legend>Shipping</legend><label><input type=radio name=shipping value=standard"
          f"{'' if express else ' checked'}> Standard (free)</label><label><input type=radio name=shipping "
          f"value=express{' checked' if express else ''}> Express ($9.99)</label>"
          f"</fieldset><p><button type=submit id=place-order>Place order</button></p></form>")
  return _render(ctx, "Checkout", body)


def orders(ctx: Ctx) -> str:
  rows = [(f"<a href='{ctx.url('shop/orders/%d' % o['id'])}'>#{o['id']}</a>", str(sum(i['qty'] for i in o['items'])),
           _money(o['total_cents']), esc(o["name"])) for o in ctx.state.orders]
  body = ("<h1>Order history</h1>" + (table(("Order", "Items", "Total", "Name"), rows, "orders") if rows
                                      else "<p id=no-orders>You have not placed any orders yet.</p>"))
  return _render(ctx, "Orders", body)


def order(ctx: Ctx, oid: int) -> str | None:
  o = next((o for o in ctx.state.orders if o["id"] == oid), None)
  if o is None:
    return None
  rows = [(esc(ctx.world.product(i["product_id"]).name), esc(i["colour"]), esc(i["size"] or "-"), str(i["qty"]))
          for i in o["items"]]
  body = (f"<div class=notice id=order-confirmation>Thank you! Your order #{o['id']} has been placed.</div>"
          f"<h1>Order #{o['id']}</h1>{table(('Product', 'Colour', 'Size', 'Qty'), rows, 'order-items')}"
          f"<p>Ship to {esc(o['name'])}, {esc(o['address'])} ({esc(o['shipping'])})</p>")
  return _render(ctx, f"Order {o['id']}", body)


def handle(ctx: Ctx) -> str | Redirect | None:
  parts = ctx.path.strip("/").split("/") if ctx.path.strip("/") else []
  if ctx.method == "POST":
    if parts == ["consent"]:
      ctx.state.cookie_consent = True
      nxt = ctx.form.get("next", "")
      return Redirect(nxt if nxt.startswith(ctx.root + "/") else ctx.url("shop/"))
    if parts == ["cart", "add"]:
      p = ctx.world.product(int_arg(ctx.form.get("product_id"), 0, 0))
      if p is None:
        return None
      size = ctx.form.get("size", "")
      if p.sizes and size not in p.sizes:
        return Redirect(ctx.url(f"shop/p/{p.id}", colour=ctx.form.get("colour"), err="size"))
      colour = ctx.form.get("colour") if ctx.form.get("colour") in p.colours else p.colours[0]
      ctx.state.add_to_cart(p.id, colour, size, int_arg(ctx.form.get("qty"), 1, 1, 99))
      return Redirect(ctx.url("shop/cart"))
    if parts == ["cart", "remove"]:
      k = int_arg(ctx.form.get("index"), -1, -1)
      if 0 <= k < len(ctx.state.cart):
        ctx.state.cart.pop(k)
      return Redirect(ctx.url("shop/cart"))
    if parts == ["checkout"]:
      return checkout(ctx)
    return None
  if not parts:
    return home(ctx)
  if parts == ["search"]:
    return search(ctx)
  if parts == ["deal"]:
    return deal(ctx)
  if len(parts) == 2 and parts[0] == "c":
    return category(ctx, parts[1])
  if len(parts) == 2 and parts[0] == "p" and parts[1].isdigit():
    return product(ctx, int(parts[1]))
  if parts == ["cart"]:
    return cart(ctx)
  if parts == ["checkout"]:
    return checkout(ctx)
  if parts == ["orders"]:
    return orders(ctx)
  if len(parts) == 2 and parts[0] == "orders" and parts[1].isdigit():
    return order(ctx, int(parts[1]))
  return None
