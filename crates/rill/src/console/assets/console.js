// Rill console: a hash-routed single page over the JSON API under /api/.
// Every value that comes from the cluster (names, keys, values, headers) is put into the
// page as text (textContent or text nodes), never as markup.
'use strict';

const POLL_MS = 3000;
const LAG_SAMPLES_MAX = 120;

// ---- small DOM helpers -------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = String(v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

function link(href, text) {
  return el('a', { href, text });
}

function fmtNum(n) {
  return n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US');
}

// A per-second rate: whole numbers from 10 up, one decimal below.
function fmtRate(v) {
  return v >= 10 ? fmtNum(Math.round(v)) : v.toFixed(1);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + units[i];
}

function fmtTime(ms) {
  if (ms === null || ms === undefined || ms < 0) return '–';
  return new Date(ms).toISOString().replace('T', ' ').replace('Z', ' UTC');
}

function badge(state) {
  const cls = { online: 'ok', Stable: 'ok', Empty: 'warn', 'under-replicated': 'warn',
    PreparingRebalance: 'warn', CompletingRebalance: 'warn', offline: 'bad', Dead: 'bad',
    active: 'ok', 'fenced or offline': 'bad' }[state] || '';
  return el('span', { class: 'badge ' + cls, text: state });
}

// A table: caption, headers ([text, numeric?]), rows (arrays of cells), and the text
// shown when there are no rows.
function table(caption, headers, rows, emptyText) {
  const head = el('tr', {}, headers.map(([h, num]) => el('th', { scope: 'col', class: num ? 'num' : null, text: h })));
  const body = el('tbody');
  if (rows.length === 0) {
    body.appendChild(el('tr', { class: 'empty' }, el('td', { colspan: headers.length, text: emptyText || 'None.' })));
  }
  for (const row of rows) {
    body.appendChild(el('tr', {}, row.map((cell, i) => {
      const num = headers[i] && headers[i][1];
      return el('td', { class: num ? 'num' : null }, cell instanceof Node ? cell : String(cell ?? '–'));
    })));
  }
  return el('div', { class: 'scroll' }, el('table', {}, el('caption', { text: caption }), el('thead', {}, head), body));
}

function cards(items) {
  return el('dl', { class: 'cards' }, items.map(([label, value, cls]) =>
    el('div', { class: 'card ' + (cls || '') }, el('dt', { text: label }), el('dd', { text: value }))));
}

function announce(text) {
  const region = document.getElementById('announce');
  region.textContent = '';
  setTimeout(() => { region.textContent = text; }, 50);
}

// ---- the API -----------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const init = { method, headers: {} };
  // Every change is declared JSON, even a DELETE without a body: the API refuses other
  // writes (its guard against forms on foreign pages).
  if (method !== 'GET') init.headers['content-type'] = 'application/json';
  if (body !== undefined) init.body = JSON.stringify(body);
  let response;
  try {
    response = await fetch('/api' + path, init);
  } catch (e) {
    throw new ApiError(0, 'the node does not answer (' + e.message + ')');
  }
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.error) || ('HTTP ' + response.status));
  }
  return data;
}

function showBanner(text) {
  const banner = document.getElementById('banner');
  if (text) { banner.textContent = text; banner.hidden = false; } else { banner.hidden = true; }
}

function formMessage(node, text, ok) {
  node.textContent = text;
  node.className = 'msg ' + (ok ? 'ok' : 'error');
  announce(text);
}

// ---- pages -------------------------------------------------------------------------

function pageHeader(view, title, crumbs) {
  const h1 = el('h1', { text: title });
  if (crumbs) view.appendChild(el('p', { class: 'crumbs' }, crumbs));
  view.appendChild(h1);
  document.title = title + ' · Rill console';
}

const pages = {};

pages.overview = (view) => {
  pageHeader(view, 'Cluster overview');
  const summary = el('div');
  const brokers = el('div');
  append(view, [summary, el('h2', { text: 'Brokers' }), brokers]);
  return async () => {
    const c = await api('GET', '/cluster');
    const s = c.partition_states;
    replace(summary, cards([
      ['Brokers', fmtNum(c.brokers.filter((b) => !b.fenced).length)],
      ['Active controller', c.controller_id >= 0 ? 'broker ' + c.controller_id : 'none'],
      ['Topics', fmtNum(c.topics)],
      ['Partitions', fmtNum(c.partitions)],
      ['Online', fmtNum(s.online), s.online === c.partitions ? 'ok' : ''],
      ['Under-replicated', fmtNum(s.under_replicated), s.under_replicated ? 'warn' : ''],
      ['Offline', fmtNum(s.offline), s.offline ? 'bad' : ''],
    ]), el('p', { class: 'note', text: 'Cluster id ' + (c.cluster_id || '–') + '; ' + c.internal_topics + ' internal topic(s) not counted above.' }));
    replace(brokers, table('Brokers of the cluster', [['ID', true], ['Address'], ['Rack'], ['State'], ['Controller']],
      c.brokers.map((b) => [
        b.id,
        b.host === null ? '–' : b.host + ':' + b.port,
        b.rack || '–',
        badge(b.fenced ? 'fenced or offline' : 'active'),
        b.id === c.controller_id ? 'active controller' : '',
      ]), 'No brokers.'));
  };
};

pages.topics = (view) => {
  pageHeader(view, 'Topics');
  const msg = el('p', { class: 'msg', role: 'status' });
  const name = el('input', { id: 'new-topic-name', name: 'name', required: true, pattern: '[a-zA-Z0-9._\\-]{1,249}', autocomplete: 'off' });
  const parts = el('input', { id: 'new-topic-partitions', name: 'partitions', type: 'number', min: 1, max: 100000, placeholder: 'default' });
  const rf = el('input', { id: 'new-topic-rf', name: 'replication_factor', type: 'number', min: 1, max: 32, placeholder: 'default' });
  const form = el('form', { class: 'panel', id: 'create-topic' },
    el('fieldset', {}, el('legend', { text: 'Create a topic' }),
      el('div', { class: 'fields' },
        el('label', { for: 'new-topic-name' }, 'Name', name),
        el('label', { for: 'new-topic-partitions' }, 'Partitions', parts),
        el('label', { for: 'new-topic-rf' }, 'Replication factor', rf),
        el('div', {}, el('button', { type: 'submit', text: 'Create topic' })))),
    msg);
  const internal = el('input', { type: 'checkbox', id: 'show-internal' });
  const list = el('div');
  append(view, [form, el('p', {}, el('label', { class: 'inline', for: 'show-internal' }, internal, ' Show internal topics')), list]);
  let last = [];
  const render = () => {
    const rows = last.filter((t) => internal.checked || !t.internal).map((t) => [
      link('#/topics/' + encodeURIComponent(t.name), t.name),
      fmtNum(t.partitions),
      fmtNum(t.replication_factor),
      fmtBytes(t.size_bytes),
      t.offline ? badge('offline') : t.under_replicated ? badge('under-replicated') : badge('online'),
    ]);
    replace(list, table('Topics (' + rows.length + ')', [['Name'], ['Partitions', true], ['Replication factor', true], ['Size', true], ['State']], rows, 'No topics yet.'));
  };
  internal.addEventListener('change', render);
  const refresh = async () => { last = await api('GET', '/topics'); render(); };
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const body = { name: name.value.trim() };
    if (parts.value) body.partitions = Number(parts.value);
    if (rf.value) body.replication_factor = Number(rf.value);
    try {
      await api('POST', '/topics', body);
      formMessage(msg, 'Created topic ' + body.name + '.', true);
      name.value = '';
      await refresh();
    } catch (err) {
      formMessage(msg, 'Could not create ' + body.name + ': ' + err.message, false);
    }
  });
  return refresh;
};

pages.topic = (view, topic) => {
  const base = '/topics/' + encodeURIComponent(topic);
  pageHeader(view, topic, [link('#/topics', 'Topics'), ' / ', topic]);
  view.appendChild(el('p', {}, link('#/topics/' + encodeURIComponent(topic) + '/messages', 'Browse messages')));
  const partitions = el('div');
  const configs = el('div');
  // Edit a config.
  const cfgMsg = el('p', { class: 'msg', role: 'status' });
  const cfgName = el('select', { id: 'config-name' });
  const cfgValue = el('input', { id: 'config-value', autocomplete: 'off' });
  const cfgForm = el('form', { class: 'panel', id: 'edit-config' },
    el('fieldset', {}, el('legend', { text: 'Edit a config' }),
      el('div', { class: 'fields' },
        el('label', { for: 'config-name' }, 'Config', cfgName),
        el('label', { for: 'config-value' }, 'Value', cfgValue),
        el('div', {}, el('button', { type: 'submit', text: 'Set' }), ' ',
          el('button', { type: 'button', class: 'secondary', id: 'config-reset', text: 'Reset to default' })))),
    cfgMsg);
  // Add partitions.
  const partMsg = el('p', { class: 'msg', role: 'status' });
  const partCount = el('input', { id: 'partition-count', type: 'number', min: 1, max: 100000, required: true });
  const partForm = el('form', { class: 'panel', id: 'add-partitions' },
    el('fieldset', {}, el('legend', { text: 'Add partitions' }),
      el('div', { class: 'fields' },
        el('label', { for: 'partition-count' }, 'New total number of partitions', partCount),
        el('div', {}, el('button', { type: 'submit', text: 'Add partitions' })))),
    partMsg);
  // Delete the topic: typing its name is the confirmation.
  const delMsg = el('p', { class: 'msg', role: 'status' });
  const delName = el('input', { id: 'delete-confirm', autocomplete: 'off' });
  const delForm = el('form', { class: 'panel', id: 'delete-topic' },
    el('fieldset', {}, el('legend', { text: 'Delete this topic' }),
      el('div', { class: 'fields' },
        el('label', { for: 'delete-confirm' }, 'Type the topic name to confirm', delName),
        el('div', {}, el('button', { type: 'submit', class: 'danger', text: 'Delete topic' })))),
    delMsg);
  append(view, [el('h2', { text: 'Partitions' }), partitions, el('h2', { text: 'Configs' }), configs,
    el('h2', { text: 'Change' }), el('div', { class: 'grid2' }, cfgForm, partForm), delForm]);

  let known = [];
  const refresh = async () => {
    const t = await api('GET', base);
    replace(partitions, table('Partitions of ' + topic, [['Partition', true], ['Leader', true], ['Replicas'], ['In-sync replicas'], ['State'], ['Log start', true], ['Log end', true], ['Size', true]],
      t.partitions.map((p) => [p.partition, p.leader ?? 'none', p.replicas.join(', '), p.isr.join(', '), badge(p.state),
        fmtNum(p.log_start_offset), fmtNum(p.log_end_offset), fmtBytes(p.size_bytes)]), 'No partitions.'));
    replace(configs, table('Configs of ' + topic, [['Name'], ['Value'], ['Source']],
      t.configs.map((c) => [c.name, c.is_sensitive ? '(sensitive)' : (c.value ?? '–'),
        c.read_only ? 'read-only' : c.is_default ? 'default' : 'set on the topic']), 'No configs.'));
    if (!partCount.value) partCount.value = String(t.partitions.length + 1);
    const editable = t.configs.filter((c) => !c.read_only).map((c) => c.name);
    if (editable.join() !== known.join()) {
      known = editable;
      const chosen = cfgName.value;
      replace(cfgName, editable.map((n) => el('option', { value: n, text: n })));
      if (editable.includes(chosen)) cfgName.value = chosen;
    }
  };
  const alter = async (value) => {
    try {
      await api('PUT', base + '/configs', { name: cfgName.value, value });
      formMessage(cfgMsg, value === null ? 'Reset ' + cfgName.value + ' to its default.' : 'Set ' + cfgName.value + ' = ' + value + '.', true);
      await refresh();
    } catch (err) { formMessage(cfgMsg, 'Could not change ' + cfgName.value + ': ' + err.message, false); }
  };
  cfgForm.addEventListener('submit', (e) => { e.preventDefault(); alter(cfgValue.value); });
  cfgForm.querySelector('#config-reset').addEventListener('click', () => alter(null));
  partForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      await api('POST', base + '/partitions', { count: Number(partCount.value) });
      formMessage(partMsg, topic + ' now has ' + partCount.value + ' partitions.', true);
      await refresh();
    } catch (err) { formMessage(partMsg, 'Could not add partitions: ' + err.message, false); }
  });
  delForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (delName.value !== topic) { formMessage(delMsg, 'Type ' + topic + ' exactly to delete it.', false); return; }
    try {
      await api('DELETE', base);
      announce('Deleted topic ' + topic + '.');
      location.hash = '#/topics';
    } catch (err) { formMessage(delMsg, 'Could not delete: ' + err.message, false); }
  });
  return refresh;
};

pages.messages = (view, topic) => {
  pageHeader(view, 'Messages of ' + topic, [link('#/topics', 'Topics'), ' / ', link('#/topics/' + encodeURIComponent(topic), topic), ' / messages']);
  const msg = el('p', { class: 'msg', role: 'status' });
  const partition = el('input', { id: 'browse-partition', type: 'number', min: 0, value: 0 });
  const from = el('select', { id: 'browse-from' },
    el('option', { value: 'end', text: 'The end (last N)' }),
    el('option', { value: 'offset', text: 'An offset' }),
    el('option', { value: 'timestamp', text: 'A time' }));
  const offset = el('input', { id: 'browse-offset', type: 'number', min: 0, value: 0 });
  const time = el('input', { id: 'browse-time', type: 'datetime-local', step: 1 });
  const limit = el('input', { id: 'browse-limit', type: 'number', min: 1, max: 500, value: 50 });
  const key = el('input', { id: 'browse-key', autocomplete: 'off', placeholder: 'substring' });
  const encoding = el('select', { id: 'browse-encoding' },
    el('option', { value: 'text', text: 'Text' }), el('option', { value: 'json', text: 'JSON (pretty)' }), el('option', { value: 'hex', text: 'Hex' }));
  const follow = el('input', { id: 'browse-follow', type: 'checkbox' });
  const offsetLabel = el('label', { for: 'browse-offset' }, 'Offset', offset);
  const timeLabel = el('label', { for: 'browse-time' }, 'Time (local)', time);
  const form = el('form', { class: 'panel', id: 'browse' },
    el('fieldset', {}, el('legend', { text: 'Read records' }),
      el('div', { class: 'fields' },
        el('label', { for: 'browse-partition' }, 'Partition', partition),
        el('label', { for: 'browse-from' }, 'From', from),
        offsetLabel, timeLabel,
        el('label', { for: 'browse-limit' }, 'At most (records)', limit),
        el('label', { for: 'browse-key' }, 'Key contains', key),
        el('label', { for: 'browse-encoding' }, 'Show as', encoding),
        el('label', { class: 'inline', for: 'browse-follow' }, follow, 'Re-read every 3 s'),
        el('div', {}, el('button', { type: 'submit', text: 'Read' })))),
    msg);
  const results = el('div');
  append(view, [form, results]);
  const showFields = () => {
    offsetLabel.hidden = from.value !== 'offset';
    timeLabel.hidden = from.value !== 'timestamp';
  };
  from.addEventListener('change', showFields);
  showFields();
  const shown = (v) => {
    if (v === null) return el('span', { class: 'note', text: 'null' });
    const pre = el('pre', { class: 'data', text: v.text });
    const notes = [];
    if (v.not_json) notes.push('not JSON, shown as text');
    if (v.truncated) notes.push('first ' + v.text.length + ' of ' + v.size + ' bytes');
    return notes.length ? el('div', {}, pre, el('span', { class: 'note', text: notes.join('; ') })) : pre;
  };
  const read = async () => {
    const q = new URLSearchParams({ partition: partition.value || '0', from: from.value, limit: limit.value || '50', encoding: encoding.value });
    if (key.value) q.set('key', key.value);
    if (from.value === 'offset') q.set('offset', offset.value || '0');
    if (from.value === 'timestamp') {
      const ms = Date.parse(time.value);
      if (Number.isNaN(ms)) { formMessage(msg, 'Choose a time to read from.', false); return; }
      q.set('timestamp', String(ms));
    }
    const r = await api('GET', '/topics/' + encodeURIComponent(topic) + '/messages?' + q.toString());
    replace(results, table('Records ' + r.from + ' to ' + (r.next_offset - 1) + ' of partition ' + r.partition + ' (log ' + r.log_start_offset + '–' + r.log_end_offset + ')',
      [['Offset', true], ['Timestamp'], ['Key'], ['Value'], ['Headers']],
      r.records.map((rec) => [rec.offset, fmtTime(rec.timestamp), shown(rec.key), shown(rec.value),
        rec.headers.length ? el('div', {}, rec.headers.map((h) => el('div', {}, el('strong', { text: h.key + ': ' }), shown(h.value)))) : '–']),
      key.value ? 'No records with such a key in the range read.' : 'No records in this range.'));
    formMessage(msg, r.records.length + ' record(s)' + (r.timed_out ? ' (stopped after 5 s)' : '') + '.', true);
  };
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try { await read(); } catch (err) { formMessage(msg, 'Could not read: ' + err.message, false); }
  });
  encoding.addEventListener('change', () => form.requestSubmit());
  // The first read happens on load; later polls only when following.
  let first = true;
  return async () => {
    if (first || follow.checked) { first = false; await read(); }
  };
};

pages.groups = (view) => {
  pageHeader(view, 'Consumer groups');
  const list = el('div');
  view.appendChild(list);
  return async () => {
    const groups = await api('GET', '/groups');
    replace(list, table('Consumer groups (' + groups.length + ')', [['Group'], ['State'], ['Members', true], ['Protocol type'], ['Coordinator', true]],
      groups.map((g) => [link('#/groups/' + encodeURIComponent(g.group_id), g.group_id), badge(g.state), fmtNum(g.members), g.protocol_type || '–', g.coordinator]),
      'No consumer groups.'));
  };
};

// Total lag samples per group, kept while the console is open (the chart's history).
const lagHistory = new Map();

// A line chart of one or more series over time, drawn as SVG: `series` is
// [{ name, points: [{ t, v }] }]; `fmt` formats the axis' top value. Each series' line has
// class `s<i>` (its colour) and, with more than one, a legend names them.
function lineChart(series, fmt) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  // The left margin holds the axis' top value ("361.9 KiB/s").
  const w = 600, h = 160, left = 72, bottom = 24;
  svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
  const all = series.flatMap((s) => s.points);
  const max = Math.max(Number.MIN_VALUE, ...all.map((p) => p.v));
  const top = max > Number.MIN_VALUE ? max : 1;
  const t0 = all.length ? Math.min(...all.map((p) => p.t)) : 0;
  const t1 = all.length ? Math.max(...all.map((p) => p.t)) : 1;
  const span = Math.max(1, t1 - t0);
  const line = (x1, y1, x2, y2) => {
    const l = document.createElementNS(ns, 'line');
    l.setAttribute('x1', x1); l.setAttribute('y1', y1); l.setAttribute('x2', x2); l.setAttribute('y2', y2);
    svg.appendChild(l);
  };
  const text = (x, y, s, cls) => {
    const t = document.createElementNS(ns, 'text');
    t.setAttribute('x', x); t.setAttribute('y', y); t.textContent = s;
    if (cls) t.setAttribute('class', cls);
    svg.appendChild(t);
  };
  line(left, h - bottom, w - 4, h - bottom);
  line(left, 4, left, h - bottom);
  text(2, 14, fmt(top));
  text(2, h - bottom, '0');
  series.forEach((s, i) => {
    const poly = document.createElementNS(ns, 'polyline');
    poly.setAttribute('class', 's' + i);
    poly.setAttribute('points', s.points.map((p) => {
      const x = left + ((p.t - t0) / span) * (w - left - 8);
      const y = (h - bottom) - (p.v / top) * (h - bottom - 8);
      return x.toFixed(1) + ',' + y.toFixed(1);
    }).join(' '));
    svg.appendChild(poly);
    // The newest point as a dot, so that a single sample shows too.
    const last = s.points[s.points.length - 1];
    if (last) {
      const dot = document.createElementNS(ns, 'circle');
      dot.setAttribute('class', 's' + i);
      dot.setAttribute('cx', (left + ((last.t - t0) / span) * (w - left - 8)).toFixed(1));
      dot.setAttribute('cy', ((h - bottom) - (last.v / top) * (h - bottom - 8)).toFixed(1));
      dot.setAttribute('r', 3);
      svg.appendChild(dot);
    }
    if (series.length > 1) text(left + 8 + i * 140, h - 6, '\u25A0 ' + s.name, 's' + i);
  });
  return svg;
}

function lagChart(samples) {
  return lineChart([{ name: 'lag', points: samples.map((s) => ({ t: s.t, v: s.lag })) }], String);
}

pages.group = (view, id) => {
  pageHeader(view, id, [link('#/groups', 'Consumer groups'), ' / ', id]);
  const summary = el('div');
  const chart = el('figure', { class: 'chart', id: 'lag-chart', role: 'img' });
  const caption = el('figcaption', { class: 'note' });
  const members = el('div');
  const offsets = el('div');
  const msg = el('p', { class: 'msg', role: 'status' });
  const to = el('select', { id: 'reset-to' }, el('option', { value: 'earliest', text: 'Earliest (log start)' }), el('option', { value: 'latest', text: 'Latest (log end)' }));
  const resetButton = el('button', { type: 'submit', text: 'Reset offsets' });
  const why = el('p', { class: 'note' });
  const reset = el('form', { class: 'panel', id: 'reset-offsets' },
    el('fieldset', {}, el('legend', { text: 'Reset committed offsets' }),
      el('div', { class: 'fields' }, el('label', { for: 'reset-to' }, 'To', to), el('div', {}, resetButton))),
    why, msg);
  append(view, [summary, el('h2', { text: 'Total lag over time' }), chart, el('h2', { text: 'Lag per partition' }), offsets,
    el('h2', { text: 'Members' }), members, reset]);
  if (!lagHistory.has(id)) lagHistory.set(id, []);
  const samples = lagHistory.get(id);
  const refresh = async () => {
    const g = await api('GET', '/groups/' + encodeURIComponent(id));
    samples.push({ t: Date.now(), lag: g.total_lag });
    while (samples.length > LAG_SAMPLES_MAX) samples.shift();
    replace(summary, cards([
      ['State', g.state, g.state === 'Stable' ? 'ok' : g.state === 'Dead' ? 'bad' : 'warn'],
      ['Members', fmtNum(g.members.length)],
      ['Total lag', fmtNum(g.total_lag), g.total_lag ? 'warn' : 'ok'],
      ['Coordinator', 'broker ' + g.coordinator],
      ['Assignor', g.protocol || '–'],
    ]));
    chart.setAttribute('aria-label', 'Total lag of ' + id + ' over the last ' + samples.length + ' samples; now ' + g.total_lag);
    caption.textContent = samples.length + ' sample(s), one every ' + POLL_MS / 1000 + ' s while this page is open; now ' + fmtNum(g.total_lag) + '.';
    replace(chart, lagChart(samples), caption);
    replace(offsets, table('Committed offsets and lag of ' + id, [['Topic'], ['Partition', true], ['Committed', true], ['End', true], ['Lag', true], ['Member']],
      g.offsets.map((o) => [link('#/topics/' + encodeURIComponent(o.topic), o.topic), o.partition, fmtNum(o.committed_offset), fmtNum(o.end_offset), fmtNum(o.lag), o.member_id || '–']),
      'No committed offsets.'));
    replace(members, table('Members of ' + id, [['Member'], ['Client id'], ['Host'], ['Assignment']],
      g.members.map((m) => [m.member_id, m.client_id, m.client_host, m.assignment.map((a) => a.topic + '-' + a.partition).join(', ') || '–']),
      'No members (the group is empty).'));
    const empty = g.members.length === 0;
    resetButton.disabled = !empty;
    why.textContent = empty ? 'The group has no members: its offsets can be reset.' : 'Only an empty group can be reset: stop its ' + g.members.length + ' consumer(s) first.';
  };
  reset.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const r = await api('POST', '/groups/' + encodeURIComponent(id) + '/reset', { to: to.value });
      formMessage(msg, 'Reset ' + r.reset + ' partition(s) to ' + r.to + '.', true);
      await refresh();
    } catch (err) { formMessage(msg, 'Could not reset: ' + err.message, false); }
  });
  return refresh;
};

// ---- this node's metrics -----------------------------------------------------------

// Parses the OpenMetrics text of /metrics into name -> [{ labels, value }].
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[2]) for (const l of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    const value = Number(m[3]);
    if (!Number.isFinite(value)) continue;
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

// The sum of a family's series whose labels include `match`; null when it has none.
function metricSum(metrics, name, match) {
  const series = (metrics.get(name) || []).filter((s) => Object.entries(match || {}).every(([k, v]) => s.labels[k] === v));
  return series.length ? series.reduce((a, s) => a + s.value, 0) : null;
}

// What the page charts, read off one scrape: counters (rates are taken between two
// scrapes) and gauges.
function metricsSnapshot(metrics) {
  const m = (name, match) => metricSum(metrics, name, match);
  return {
    t: Date.now(),
    bytesIn: m('kafka_server_brokertopicmetrics_bytes_in_total'),
    bytesOut: m('kafka_server_brokertopicmetrics_bytes_out_total'),
    messagesIn: m('kafka_server_brokertopicmetrics_messages_in_total'),
    requests: m('kafka_network_requestmetrics_requests_total'),
    produceTime: m('kafka_network_requestmetrics_total_time_seconds_sum', { request: 'Produce' }),
    produceCount: m('kafka_network_requestmetrics_total_time_seconds_count', { request: 'Produce' }),
    cpu: m('process_cpu_seconds_total'),
    rss: m('process_resident_memory_bytes'),
    gauges: [
      ['Partitions', m('kafka_server_replicamanager_partition_count')],
      ['Leader of', m('kafka_server_replicamanager_leader_count')],
      ['Under-replicated', m('kafka_server_replicamanager_under_replicated_partitions'), 'warn'],
      ['Under min ISR', m('kafka_server_replicamanager_under_min_isr_partition_count'), 'bad'],
      ['Client connections', m('kafka_server_socketserver_connection_count')],
      ['Active controller', m('kafka_controller_kafkacontroller_active_controller_count') ? 'this node' : 'another node'],
      ['Memory (RSS)', m('process_resident_memory_bytes'), 'bytes'],
      ['Open files', m('process_open_fds')],
    ],
  };
}

// Per-second rates and means between consecutive snapshots, for the charts.
function metricsRates(prev, cur) {
  const dt = (cur.t - prev.t) / 1000;
  const rate = (k) => (cur[k] === null || prev[k] === null || dt <= 0 ? 0 : Math.max(0, (cur[k] - prev[k]) / dt));
  const produced = (cur.produceCount || 0) - (prev.produceCount || 0);
  return {
    t: cur.t,
    bytesIn: rate('bytesIn'),
    bytesOut: rate('bytesOut'),
    messagesIn: rate('messagesIn'),
    requests: rate('requests'),
    produceMs: produced > 0 ? (1000 * ((cur.produceTime || 0) - (prev.produceTime || 0))) / produced : 0,
    cpu: rate('cpu'),
    rss: cur.rss || 0,
  };
}

// Snapshots and rates kept while the console is open (the charts' history).
const metricsHistory = { last: null, rates: [] };

const METRIC_CHARTS = [
  ['chart-bytes', 'Bytes in and out per second', [['in', 'bytesIn'], ['out', 'bytesOut']], (v) => fmtBytes(v) + '/s'],
  ['chart-messages', 'Records in per second', [['records', 'messagesIn']], fmtRate],
  ['chart-requests', 'Requests answered per second', [['requests', 'requests']], fmtRate],
  ['chart-produce', 'Produce: mean time per request (ms)', [['ms', 'produceMs']], (v) => v.toFixed(1)],
  ['chart-cpu', 'CPU (cores busy)', [['cores', 'cpu']], (v) => v.toFixed(2)],
  ['chart-rss', 'Memory (resident)', [['rss', 'rss']], fmtBytes],
];

async function scrapeMetrics() {
  let response;
  try {
    response = await fetch('/metrics');
  } catch (e) {
    throw new ApiError(0, 'the node does not answer (' + e.message + ')');
  }
  if (!response.ok) throw new ApiError(response.status, 'metrics: HTTP ' + response.status);
  return parseMetrics(await response.text());
}

pages.metrics = (view) => {
  pageHeader(view, 'Metrics of this node');
  const summary = el('div');
  const charts = METRIC_CHARTS.map(([id, title]) => {
    const figure = el('figure', { class: 'chart', id, role: 'img' });
    return { id, title, figure, caption: el('figcaption', { class: 'note' }) };
  });
  append(view, [summary, el('p', { class: 'note' }, 'Read from this node\'s ', el('a', { href: '/metrics', text: '/metrics' }),
    ' (Prometheus format) every ' + POLL_MS / 1000 + ' s while this page is open; each chart keeps the last ' + LAG_SAMPLES_MAX + ' samples.')]);
  for (const c of charts) append(view, [el('h2', { text: c.title }), c.figure]);
  return async () => {
    const snap = metricsSnapshot(await scrapeMetrics());
    if (metricsHistory.last) {
      metricsHistory.rates.push(metricsRates(metricsHistory.last, snap));
      while (metricsHistory.rates.length > LAG_SAMPLES_MAX) metricsHistory.rates.shift();
    }
    metricsHistory.last = snap;
    const rates = metricsHistory.rates;
    replace(summary, cards(snap.gauges.map(([label, v, kind]) => {
      if (typeof v === 'string') return [label, v];
      if (v === null) return [label, '–'];
      if (kind === 'bytes') return [label, fmtBytes(v)];
      return [label, fmtNum(v), kind && v > 0 ? kind : ''];
    })));
    METRIC_CHARTS.forEach(([, title, lines, fmt], i) => {
      const c = charts[i];
      const series = lines.map(([name, key]) => ({ name, points: rates.map((r) => ({ t: r.t, v: r[key] })) }));
      const now = rates.length ? lines.map(([name, key]) => name + ' ' + fmt(rates[rates.length - 1][key])).join(', ') : 'waiting for a second sample';
      c.figure.setAttribute('aria-label', title + ' over the last ' + rates.length + ' samples; now ' + now);
      c.caption.textContent = 'Now: ' + now + '.';
      replace(c.figure, lineChart(series, fmt), c.caption);
    });
  };
};

// ---- routing and polling -----------------------------------------------------------

let timer = null;
let generation = 0;

function route() {
  const parts = (location.hash.replace(/^#\/?/, '') || '').split('/').map((p) => { try { return decodeURIComponent(p); } catch (e) { return p; } });
  if (parts[0] === 'topics' && parts[1] && parts[2] === 'messages') return ['topics', () => pages.messages(view(), parts[1])];
  if (parts[0] === 'topics' && parts[1]) return ['topics', () => pages.topic(view(), parts[1])];
  if (parts[0] === 'topics') return ['topics', () => pages.topics(view())];
  if (parts[0] === 'groups' && parts[1]) return ['groups', () => pages.group(view(), parts[1])];
  if (parts[0] === 'groups') return ['groups', () => pages.groups(view())];
  if (parts[0] === 'metrics') return ['metrics', () => pages.metrics(view())];
  return ['overview', () => pages.overview(view())];
}

function view() {
  const main = document.getElementById('view');
  main.replaceChildren();
  return main;
}

async function poll(refresh, mine) {
  if (mine !== generation) return;
  try {
    await refresh();
    if (mine !== generation) return;
    showBanner(null);
    document.getElementById('updated').textContent = 'Updated ' + new Date().toLocaleTimeString();
  } catch (err) {
    if (mine !== generation) return;
    showBanner(err.message);
    document.getElementById('updated').textContent = 'Not updated';
  }
  if (mine === generation) timer = setTimeout(() => poll(refresh, mine), POLL_MS);
}

function navigate() {
  generation++;
  clearTimeout(timer);
  const [section, mount] = route();
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === section) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  const refresh = mount();
  document.getElementById('view').focus({ preventScroll: true });
  poll(refresh, generation);
}

async function start() {
  try {
    const status = await api('GET', '/status');
    if (!status.available) { showBanner(status.reason); document.getElementById('updated').textContent = 'Unavailable'; }
  } catch (err) { showBanner(err.message); }
  window.addEventListener('hashchange', navigate);
  navigate();
}

document.addEventListener('DOMContentLoaded', start);
