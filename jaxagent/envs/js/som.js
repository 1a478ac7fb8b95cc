// Set-of-marks labelling, after WebVoyager's get_web_element_rect (MinorJerry/WebVoyager:utils.py).
// Called as `(opts) => ...` with opts = {draw: bool, fixColor: bool}. Returns one record per kept element
// (its viewport rects, text, tag, type, aria-label); when `draw` is set the dashed outlines and index labels
// stay on the page in window.__jaxagentMarks until som_clear.js removes them (after the screenshot).
(opts) => {
  const vw = Math.max(document.documentElement.clientWidth || 0, window.innerWidth || 0);
  const vh = Math.max(document.documentElement.clientHeight || 0, window.innerHeight || 0);
  let items = Array.prototype.slice.call(document.querySelectorAll('*')).map((element) => {
    const rects = [...element.getClientRects()].filter((bb) => {
      const elAtCenter = document.elementFromPoint(bb.left + bb.width / 2, bb.top + bb.height / 2);
      return elAtCenter === element || element.contains(elAtCenter);
    }).map((bb) => {
      const r = {left: Math.max(0, bb.left), top: Math.max(0, bb.top),
                 right: Math.min(vw, bb.right), bottom: Math.min(vh, bb.bottom)};
      return {...r, width: r.right - r.left, height: r.bottom - r.top};
    });
    const area = rects.reduce((acc, r) => acc + r.width * r.height, 0);
    const tag = element.tagName;
    return {
      element,
      include: (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT') ||
               (tag === 'BUTTON' || tag === 'A' || element.onclick != null ||
                window.getComputedStyle(element).cursor == 'pointer') ||
               (tag === 'IFRAME' || tag === 'VIDEO' || tag === 'LI' || tag === 'TD' || tag === 'OPTION'),
      area,
      rects,
      text: element.textContent.trim().replace(/\s{2,}/g, ' '),
    };
  }).filter((item) => item.include && item.area >= 20);

  // Keep only the innermost clickable items (WebVoyager's three filters, in its order).
  const buttons = Array.from(document.querySelectorAll('button, a, input[type="button"], div[role="button"]'));
  items = items.filter((x) => !buttons.some((y) => items.some((z) => z.element === y) &&
                                                   y.contains(x.element) && !(x.element === y)));
  items = items.filter((x) => !(x.element.parentNode && x.element.parentNode.tagName === 'SPAN' &&
                                x.element.parentNode.children.length === 1 &&
                                x.element.parentNode.getAttribute('role') &&
                                items.some((y) => y.element === x.element.parentNode)));
  items = items.filter((x) => !items.some((y) => x.element.contains(y.element) && !(x == y)));

  const hex = () => '0123456789ABCDEF'[Math.floor(Math.random() * 16)];
  const randomColor = () => '#' + Array.from({length: 6}, hex).join('');
  const marks = [];
  if (opts.draw) {
    items.forEach((item, index) => {
      item.rects.forEach((bbox) => {
        const color = opts.fixColor ? '#000000' : randomColor();
        const box = document.createElement('div');
        box.style.outline = `2px dashed ${color}`;
        box.style.position = 'fixed';
        box.style.left = bbox.left + 'px';
        box.style.top = bbox.top + 'px';
        box.style.width = bbox.width + 'px';
        box.style.height = bbox.height + 'px';
        box.style.pointerEvents = 'none';
        box.style.boxSizing = 'border-box';
        box.style.zIndex = 2147483647;
        const label = document.createElement('span');
        label.textContent = index;
        label.style.position = 'absolute';
        label.style.top = Math.max(-19, -bbox.top) + 'px';
        label.style.left = Math.min(Math.floor(bbox.width / 5), 2) + 'px';
        label.style.background = color;
        label.style.color = 'white';
        label.style.padding = '2px 4px';
        label.style.fontSize = '12px';
        label.style.borderRadius = '2px';
        box.appendChild(label);
        document.body.appendChild(box);
        marks.push(box);
      });
    });
  }
  window.__jaxagentMarks = (window.__jaxagentMarks || []).concat(marks);
  return items.map((item) => ({
    tag: item.element.tagName.toLowerCase(),
    type: item.element.getAttribute('type'),
    ariaLabel: item.element.getAttribute('aria-label'),
    role: item.element.getAttribute('role') || '',
    text: item.text,
    rects: item.rects.map((r) => [r.left, r.top, r.width, r.height]),
  }));
}
