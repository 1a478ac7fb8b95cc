// Simplified HTML in the manner of WebRL's observation (THUDM/VisualAgentBench:VAB-WebArena-Lite
// new/html_tools): interactive elements get data-label-id=N on the live page and id="N" in the output;
// every kept element carries data-bbox="x,y,w,h" (viewport CSS px). A compact re-implementation of the idea:
// wrappers with nothing to say (no id, no kept attribute, no own text) are dropped and their children promoted.
// Called as `(opts) => ...` with opts = {maxText: int}. Returns {html, elements}.
(opts) => {
  const KEEP_ATTRS = ['title', 'value', 'type', 'placeholder', 'selected', 'checked', 'data-value', 'data-text',
                      'data-testid', 'data-label', 'data-status', 'aria-label', 'name', 'href'];
  const SKIP = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'META', 'LINK', 'HEAD', 'TITLE']);
  const STRUCTURAL = new Set(['HTML', 'BODY', 'IMG', 'H1', 'H2', 'H3', 'H4', 'H5', 'H6', 'P', 'LI', 'UL', 'OL',
                              'TABLE', 'TR', 'TD', 'TH', 'FORM', 'LABEL', 'NAV', 'HEADER', 'FOOTER', 'MAIN',
                              'SECTION', 'ARTICLE', 'DIALOG']);
  const INTERACTIVE_TAGS = new Set(['A', 'BUTTON', 'INPUT', 'SELECT', 'TEXTAREA', 'OPTION', 'SUMMARY']);
  const INTERACTIVE_ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem', 'option', 'switch',
                                     'combobox', 'textbox', 'searchbox', 'slider', 'treeitem']);
  const esc = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
  const bboxOf = (r) => [Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)];

  const isInteractive = (el, style) => {
    if (INTERACTIVE_TAGS.has(el.tagName)) return !(el.tagName === 'INPUT' && el.type === 'hidden');
    const role = el.getAttribute('role');
    if (role && INTERACTIVE_ROLES.has(role)) return true;
    if (el.onclick != null || el.hasAttribute('onclick')) return true;
    if (el.isContentEditable && el.contentEditable === 'true') return true;
    if (style.cursor === 'pointer') {  // a pointer inherited from a clickable parent is not a new target
      const parent = el.parentElement;
      return !(parent && window.getComputedStyle(parent).cursor === 'pointer');
    }
    return false;
  };

  document.querySelectorAll('[data-label-id]').forEach((el) => el.removeAttribute('data-label-id'));
  const elements = [];

  const emit = (node) => {
    if (node.nodeType === Node.TEXT_NODE) {
      let t = node.textContent.replace(/\s+/g, ' ').trim();
      if (t.length > opts.maxText) t = t.slice(0, opts.maxText) + '...';
      return t ? esc(t) : '';
    }
    if (node.nodeType !== Node.ELEMENT_NODE || SKIP.has(node.tagName)) return '';
    const style = window.getComputedStyle(node);
    if (style.display === 'none' || style.visibility === 'hidden') return '';
    const rect = node.getBoundingClientRect();
    const sized = rect.width > 0 && rect.height > 0;
    let id = null;
    if (sized && isInteractive(node, style)) {
      id = elements.length;
      node.setAttribute('data-label-id', String(id));
      elements.push(null);  // reserve the slot so ids follow document order
    }
    const inner = [];
    const kids = node.tagName === 'SELECT' ? node.options : node.childNodes;  // closed selects still list options
    for (const child of kids) {
      const s = emit(child);
      if (s) inner.push(s);
    }
    for (const child of node.shadowRoot ? node.shadowRoot.childNodes : []) {
      const s = emit(child);
      if (s) inner.push(s);
    }
    const attrs = [];
    for (const a of KEEP_ATTRS) {
      const liveValue = a === 'value' && 'value' in node && node.tagName !== 'BUTTON' && node.tagName !== 'LI';
      let v = liveValue ? node.value : node.getAttribute(a);  // what the user typed, not the initial value
      if ((a === 'selected' || a === 'checked') && node[a] === true) v = 'true';
      if (v != null && v !== '' && v !== false) attrs.push(`${a}="${esc(String(v).slice(0, opts.maxText))}"`);
    }
    if (node.tagName === 'IMG' && node.alt && !node.title) attrs.push(`title="${esc(node.alt)}"`);
    const ownText = [...node.childNodes].some((c) => c.nodeType === Node.TEXT_NODE && c.textContent.trim());
    const isRoot = node.tagName === 'HTML' || node.tagName === 'BODY';
    const keep = id !== null || (STRUCTURAL.has(node.tagName) && (inner.length || attrs.length || isRoot)) ||
                 (ownText && attrs.length);
    if (id !== null) {
      const text = (node.innerText || node.value || '').trim().replace(/\s+/g, ' ').slice(0, 200);
      const attrPairs = attrs.map((s) => { const i = s.indexOf('='); return [s.slice(0, i), s.slice(i + 2, -1)]; });
      elements[id] = {index: id, tag: node.tagName.toLowerCase(), text, bbox: bboxOf(rect),
                      role: node.getAttribute('role') || '', attrs: Object.fromEntries(attrPairs)};
    }
    if (!keep) return inner.join(' ');
    if (!sized && !inner.length) return '';
    const tag = node.tagName.toLowerCase();
    const idAttr = id !== null ? `id="${id}"` : null;
    const head = [tag, idAttr, ...attrs, `data-bbox="${bboxOf(rect).join(',')}"`].filter(Boolean).join(' ');
    return `<${head}> ${inner.join(' ')} </${tag}>`;
  };
  const html = emit(document.documentElement);
  return {html, elements};
}
