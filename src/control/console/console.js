// The operator console: every number here comes from the admin API, called with the token
// the operator typed (kept in this tab's sessionStorage, sent as a Bearer header, never in a
// URL or a cookie). Everything a client chose (ids, metadata, request ids) is set as text,
// never parsed as HTML.
'use strict';

const TOKEN_KEY = 'turnstile-admin-token';
const SIGNED_OUT_KEY = 'turnstile-signed-out';
const POLL_MS = 2000;
const WINDOW_POINTS = (15 * 60 * 1000) / POLL_MS;
const CLASSES = [
  ['2xx', '#2e7d32'], ['4xx', '#f9a825'], ['429', '#ef6c00'], ['503', '#c62828'], ['5xx', '#6a1b9a'],
];

const state = { token: sessionStorage.getItem(TOKEN_KEY) || '', page: 'overview', timer: null, last: null, series: [] };

const $ = (selector) => document.querySelector(selector);

// Characters that change how text reads without showing themselves: controls, bidirectional
// overrides and isolates (U+202E makes "\u202Eexe.gnp" read "png.exe" and reorders what
// follows), zero-width and other invisible ones. Shown escaped, in a box of their own.
const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb]/g;

/** `text` as nodes: as it is, but for the characters HIDDEN finds, each shown as `\uXXXX`. */
function visible(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(HIDDEN)) {
    if (m.index > at) out.push(document.createTextNode(text.slice(at, m.index)));
    const code = m[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, '0');
    const shown = document.createElement('span');
    shown.className = 'hidden-char';
    shown.title = `an invisible or direction-changing character, U+${code}`;
    shown.textContent = `\\u${code}`;
    out.push(shown);
    at = m.index + m[0].length;
  }
  if (at < text.length || !out.length) out.push(document.createTextNode(text.slice(at)));
  return out;
}

/** Replaces what `node` shows with `text`, made visible. */
function setText(node, text) {
  node.replaceChildren(...visible(text == null ? '' : String(text)));
}

/** An element with attributes and children (strings become text nodes, never HTML; their
 *  invisible characters shown escaped). */
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(...(c instanceof Node ? [c] : visible(c == null ? '' : String(c))));
  return e;
}

function say(text, bad = false) {
  const s = $('#status');
  setText(s, text);
  s.className = bad ? 'error' : 'muted';
}

class Unauthorized extends Error {}
class Throttled extends Error {}

/** One admin API call: JSON in and out (or text), the token in the header. */
async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method, headers, credentials: 'omit', cache: 'no-store', redirect: 'error',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) throw new Unauthorized('the token was refused');
  if (response.status === 429 && path === '/healthz') {
    throw new Throttled(`too many wrong tokens from this address: try again in ${response.headers.get('retry-after') || 'a few'} s`);
  }
  const text = await response.text();
  let data = text;
  if ((response.headers.get('content-type') || '').includes('json')) {
    try { data = JSON.parse(text); } catch (_) { data = text; }
  }
  return { status: response.status, data };
}

async function signIn(token) {
  if (!token) return;
  state.token = token;
  try {
    await api('GET', '/healthz');
  } catch (e) {
    state.token = '';
    $('#token').value = '';
    $('#sign-in-error').textContent = e instanceof Unauthorized ? 'That token was refused.'
      : e instanceof Throttled ? `Refused: ${e.message}.` : `No answer: ${e.message}`;
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('#sign-in').hidden = true;
  $('#tabs').hidden = false;
  show(state.page);
  if (!state.timer) state.timer = setInterval(tick, POLL_MS);
  tick();
}

// Signing out forgets everything: the token (storage, field, memory) and every view drawn
// with it — a key shown once included — by loading the page anew, in place of this one in
// the history (Back does not bring it back). Why, if the token was refused, survives it.
function signOut(message) {
  clearInterval(state.timer);
  state.token = '';
  $('#token').value = '';
  sessionStorage.clear();
  if (message) sessionStorage.setItem(SIGNED_OUT_KEY, message);
  for (const page of document.querySelectorAll('.page')) page.replaceChildren();
  location.replace(location.pathname);
}

function show(page) {
  state.page = page;
  say('');
  for (const p of document.querySelectorAll('.page')) p.hidden = p.id !== page;
  for (const b of document.querySelectorAll('#tabs [data-page]')) {
    if (b.dataset.page === page) b.setAttribute('aria-current', 'page');
    else b.removeAttribute('aria-current');
  }
  refresh();
}

async function guarded(work) {
  try {
    await work();
  } catch (e) {
    if (e instanceof Unauthorized) signOut('The token was refused.');
    else say(`The admin API did not answer: ${e.message}`, true);
  }
}

// Live pages follow the data; the clients page changes only when the operator acts (a list
// rebuilt under the keyboard would lose its focus).
function tick() {
  guarded(sample).then(() => { if (state.page !== 'clients' && state.page !== 'lookup') refresh(); });
}
function refresh() { guarded(refreshCurrent); }

async function refreshCurrent() {
  if (state.page === 'overview') await overview();
  else if (state.page === 'limited') await limited();
  else if (state.page === 'clients') await clients();
  else if (state.page === 'routes') await routes();
  else if (state.page === 'pools') await pools();
}

// ---- Overview: rates from the Prometheus counters, sampled every POLL_MS.

/** Why the admin API refused a change (a read-only token's 403 names itself). */
function refusal(data, status) {
  return (data && (data.detail || data.title || data.error)) || `answer ${status}`;
}

/** Sums of `turnstile_requests_total` by status class, and the duration histogram's buckets. */
function readMetrics(text) {
  const classes = Object.fromEntries(CLASSES.map(([c]) => [c, 0]));
  const buckets = new Map();
  for (const line of text.split('\n')) {
    let m = line.match(/^turnstile_requests_total\{.*status="(\d+)".*\} (\S+)$/);
    if (m) {
      const status = Number(m[1]);
      const n = Number(m[2]);
      if (status === 429) classes['429'] += n;
      else if (status === 503) classes['503'] += n;
      else if (status >= 500) classes['5xx'] += n;
      else if (status >= 400) classes['4xx'] += n;
      else classes['2xx'] += n;
      continue;
    }
    m = line.match(/^turnstile_request_duration_seconds_bucket\{.*le="([^"]+)".*\} (\S+)$/);
    if (m) buckets.set(m[1], (buckets.get(m[1]) || 0) + Number(m[2]));
  }
  return { at: Date.now(), classes, buckets };
}

/** The 99th percentile of the requests between two readings (the bucket's upper bound). */
function p99(before, after) {
  const bounds = [...after.buckets.keys()].sort((a, b) => Number(a) - Number(b));
  const delta = (le) => (after.buckets.get(le) || 0) - ((before.buckets.get(le)) || 0);
  const total = delta('+Inf');
  if (!(total > 0)) return null;
  const bound = bounds.find((le) => delta(le) >= 0.99 * total);
  return bound === '+Inf' ? '> largest bucket' : `≤ ${Number(bound) * 1000} ms`;
}

async function sample() {
  const { data } = await api('GET', '/metrics');
  const now = readMetrics(String(data));
  if (state.last) {
    const secs = (now.at - state.last.at) / 1000;
    const rates = {};
    for (const [c] of CLASSES) rates[c] = Math.max(0, (now.classes[c] - state.last.classes[c]) / secs);
    state.series.push({ at: now.at, rates });
    if (state.series.length > WINDOW_POINTS) state.series.shift();
    const total = Object.values(rates).reduce((a, b) => a + b, 0);
    $('#rate-now').textContent = total.toFixed(1);
    $('#p99-now').textContent = p99(state.last, now) || 'no requests';
  }
  state.last = now;
  $('#samples').textContent = String(state.series.length);
  draw();
}

function draw() {
  const svg = $('#chart');
  const ns = 'http://www.w3.org/2000/svg';
  svg.replaceChildren();
  const points = state.series;
  const max = Math.max(1, ...points.flatMap((p) => Object.values(p.rates)));
  const x = (i) => (points.length < 2 ? 0 : (i / (points.length - 1)) * 600);
  const y = (v) => 195 - (v / max) * 185;
  for (const [c, color] of CLASSES) {
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('fill', 'none');
    line.setAttribute('stroke', color);
    line.setAttribute('stroke-width', '2');
    line.setAttribute('data-class', c);
    line.setAttribute('points', points.map((p, i) => `${x(i).toFixed(1)},${y(p.rates[c]).toFixed(1)}`).join(' '));
    svg.append(line);
  }
  // Beside the chart, not in it: the chart stretches to the page's width, its text would too.
  $('#chart-max').textContent = `top of the chart: ${max.toFixed(1)}/s`;
}

async function overview() {
  const [{ data: config }, { data: ready }, { data: history }, { data: fleet, status: fleetStatus }] = await Promise.all([
    api('GET', '/config'), api('GET', '/readyz'), api('GET', '/reloads'), api('GET', '/fleet'),
  ]);
  const utc = (s) => new Date(s * 1000).toISOString().replace('T', ' ').slice(0, 19);
  if (fleetStatus !== 200 || !Array.isArray(fleet.instances)) {
    // The store did not answer: say so, never "nobody".
    failTable('#fleet-list', 4, `Unknown: ${(fleet && fleet.error) || `the fleet's answer was ${fleetStatus}`}.`);
  } else {
    fillTable('#fleet-list', fleet.instances.map((i) => ({
      instance: i.this ? `${i.id} (this one)` : i.id,
      version: i.version || 'not announced',
      started: i.started_at ? utc(i.started_at) : '–',
      seen: `${(i.last_seen_ms / 1000).toFixed(1)} s ago`,
    })), ['instance', 'version', 'started', 'seen']);
  }
  fillTable('#reload-list', (history.reloads || []).slice(0, 10).map((r) => ({
    when: utc(r.at),
    trigger: r.trigger,
    result: r.result,
    version: r.version,
    what: [...r.changed, ...r.problems].join('; ') + (r.more ? ` (+${r.more} more)` : ''),
  })), ['when', 'trigger', 'result', 'version', 'what']);
  setText($('#config-version'), `version ${config.version} (${String(config.hash).slice(0, 12)})`);
  const store = ready.store || {};
  const nodes = (store.nodes || []).filter((n) => n.slots > 0);
  const shards = nodes.length ? `; ${nodes.filter((n) => n.circuit_breaker === 'closed').length}/${nodes.length} shards closed` : '';
  const warming = store.warming ? ' (warming)' : '';
  setText($('#store-state'), `${store.kind}: ${store.status}${warming}, breaker ${store.circuit_breaker}${shards}`);
  if (!$('#legend').childElementCount) {
    for (const [c, color] of CLASSES) {
      const swatch = el('i');
      swatch.style.background = color;
      $('#legend').append(el('span', {}, swatch, c));
    }
  }
}

// ---- Limited right now, and one refusal looked up by its request id.

function fillTable(selector, rows, columns) {
  const body = $(`${selector} tbody`);
  body.replaceChildren(...rows.map((r) => el('tr', {}, ...columns.map((c) => el('td', {}, r[c])))));
  if (!rows.length) body.append(el('tr', {}, el('td', { colspan: String(columns.length), class: 'muted' }, 'nobody')));
}

/** A table whose data could not be had: one row saying why. */
function failTable(selector, columns, why) {
  $(`${selector} tbody`).replaceChildren(el('tr', {}, el('td', { colspan: String(columns), class: 'error' }, why)));
}

async function limited() {
  const { data } = await api('GET', '/limited');
  // The fleet's view where a shared store has one; else (or when it did not answer) this
  // instance's own.
  const fleet = data.fleet && data.fleet.minute ? data.fleet : null;
  const view = fleet || data;
  setText($('#limited-scope'), fleet
    ? `the fleet: ${fleet.merged.length} of ${fleet.instances} instance(s) merged, as of their last heartbeat`
    : `this instance (${data.instance})${data.fleet && data.fleet.error ? `; the fleet: ${data.fleet.error}` : ''}`);
  $('#minute-count').textContent = String(view.minute.refusals);
  $('#hour-count').textContent = String(view.hour.refusals);
  $('#minute-floor').textContent = String(view.minute.floor);
  $('#hour-floor').textContent = String(view.hour.floor);
  const columns = ['route', 'limit', 'caller', 'count', 'error'];
  fillTable('#limited-minute', view.minute.top, columns);
  fillTable('#limited-hour', view.hour.top, columns);
}

/** `id` as one path segment (client ids and key ids, never only dots: the API's rule). */
function segment(id) {
  return encodeURIComponent(id);
}

async function lookup(id) {
  const out = $('#lookup-result');
  // In the query: a path segment of dots would be resolved away by the browser.
  const { status, data } = await api('GET', `/refusals?id=${encodeURIComponent(id)}`);
  if (status !== 200) {
    out.replaceChildren(el('p', { class: 'error' }, data.error || `answer ${status}`));
    return;
  }
  const rows = [
    ['status', data.status], ['route', data.route], ['caller', data.caller], ['reason', data.reason],
    ['retry after', `${data.retry_after_s} s`], ['when', new Date(data.at_unix_ms).toISOString()], ['instance', data.instance],
  ];
  for (const l of data.limits) {
    rows.push([`limit ${l.name}`, `${l.remaining} of ${l.limit} left, resets in ${Math.ceil(l.reset_ms / 1000)} s, retry in ${Math.ceil(l.retry_after_ms / 1000)} s`]);
    if (l.key) rows.push([`${l.name}: key`, el('code', {}, l.key)]);
  }
  out.replaceChildren(el('dl', { id: 'refusal' }, ...rows.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])));
}

// ---- Routes and pools: the configuration as the gateway understood it, with the pools' state
// from the metrics.

/** A limit as one line: "per-minute: 100 / 1m sliding_window (key header:x-tenant)". */
function describeLimit(l) {
  const key = l.key && l.key.length ? ` by ${l.key.join(', ')}` : '';
  return `${l.name}: ${l.limit} / ${l.window} ${l.algorithm}${key}${l.shadow ? ' (shadow)' : ''}`;
}

async function routes() {
  const { status, data } = await api('GET', '/config');
  if (status !== 200) { say(refusal(data, status), true); return; }
  const config = data.config;
  $('#routes-version').textContent = `version ${data.version}, ${String(data.hash).slice(0, 12)}`;
  fillTable('#route-list', config.routes.map((r) => ({
    route: r.name,
    match: [r.host, r.path_prefix, r.methods ? r.methods.join(' ') : ''].filter(Boolean).join(' '),
    auth: Array.isArray(r.auth) ? r.auth.join(' or ') : r.auth,
    limits: r.limits.length ? r.limits.map(describeLimit).join('; ') : (r.auth === 'none' ? 'none' : 'the client\'s plan'),
    failure: r.on_store_error,
    priority: r.priority,
    upstream: r.upstream ?? r.answers,
  })), ['route', 'match', 'auth', 'limits', 'failure', 'priority', 'upstream']);
  fillTable('#plan-list', config.plans.map((p) => ({
    plan: p.name,
    limits: p.limits.map(describeLimit).join('; '),
    concurrent: p.max_concurrent == null ? '–' : p.max_concurrent,
    lease: p.lease == null ? '–' : p.lease,
  })), ['plan', 'limits', 'concurrent', 'lease']);
}

/** Values of one metric family by label set: [{labels, value}]. */
function family(text, name) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const m = line.match(/^[^{]+\{(.*)\} (\S+)$/);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of m[1].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    out.push({ labels, value: Number(m[2]) });
  }
  return out;
}

async function pools() {
  const [{ data: shown }, { data: text }] = await Promise.all([api('GET', '/config'), api('GET', '/metrics')]);
  const sum = (name, match) => family(text, name).filter((s) => match(s.labels)).reduce((a, s) => a + s.value, 0);
  const upstreams = shown.config.upstreams;
  fillTable('#pool-list', upstreams.map((u) => {
    const of = (l) => l.upstream === u.name;
    const shedding = (state) => sum('turnstile_shedding', (l) => of(l) && l.state === state);
    return {
      pool: u.name,
      balance: u.balance,
      inflight: u.shedding ? shedding('in_flight') : '–',
      limit: u.shedding ? shedding('limit') : 'off',
      shed: sum('turnstile_shed_total', of),
      retries: sum('turnstile_upstream_retries_total', of),
      ejections: sum('turnstile_upstream_ejections_total', of),
    };
  }), ['pool', 'balance', 'inflight', 'limit', 'shed', 'retries', 'ejections']);
  fillTable('#server-list', upstreams.flatMap((u) => u.servers.map((server) => {
    const of = (l) => l.upstream === u.name && l.server === server;
    const healthy = family(text, 'turnstile_upstream_server_healthy').find((s) => of(s.labels));
    return {
      pool: u.name,
      server,
      health: healthy === undefined ? 'not checked yet' : (healthy.value === 1 ? 'healthy' : 'unhealthy'),
      ejected: sum('turnstile_upstream_server_ejected', of) ? 'yes' : 'no',
    };
  })), ['pool', 'server', 'health', 'ejected']);
}

// ---- Clients: list, search, create, issue and revoke keys.

async function clients() {
  const { data } = await api('GET', '/clients');
  const needle = $('#client-search').value.trim().toLowerCase();
  const list = (data.clients || []).filter((c) => !needle || String(c.id).toLowerCase().includes(needle));
  $('#client-list tbody').replaceChildren(...list.map((c) => el('tr', {},
    el('td', {}, el('button', { type: 'button', class: 'client-link', onclick: () => guarded(() => detail(c.id)) }, c.id)),
    el('td', {}, c.plan), el('td', {}, String((c.keys || []).length)), el('td', {}, c.source))));
}

/** Why `id` cannot be a client id (the API's own rule), or null. */
function badClientId(id) {
  return /^[A-Za-z0-9_.-]{1,64}$/.test(id) && !/^\.+$/.test(id) ? null
    : 'a client id is 1 to 64 of A-Z a-z 0-9 _ - ., and not only dots';
}

/** Metadata as a table of names and values (a value that is not text as JSON). */
function metadataTable(metadata) {
  const entries = Object.entries(metadata || {});
  if (!entries.length) return el('p', { class: 'muted' }, 'no metadata');
  return el('table', { id: 'metadata' }, el('thead', {}, el('tr', {}, el('th', {}, 'name'), el('th', {}, 'value'))),
    el('tbody', {}, ...entries.map(([k, v]) => el('tr', {}, el('td', {}, k), el('td', {}, typeof v === 'string' ? v : JSON.stringify(v))))));
}

async function detail(id, issued) {
  const path = `/clients/${segment(id)}`;
  const [{ data: client }, { data: usage }] = await Promise.all([api('GET', path), api('GET', `${path}/usage`)]);
  const parts = [el('h3', { id: 'detail-id' }, client.id)];
  parts.push(el('p', {}, `plan ${client.plan}`), el('p', {}, (client.groups || []).length ? `groups ${client.groups.join(', ')}` : 'in no group'), el('h4', {}, 'Metadata'), metadataTable(client.metadata));
  if (issued) parts.push(el('p', {}, 'New key (shown once): ', el('span', { class: 'secret', id: 'issued-key' }, issued)));
  const keys = (client.keys || []).map((k) => el('li', {}, el('code', {}, k.id), ' ',
    el('button', { type: 'button', class: 'revoke', 'data-key': k.id, onclick: () => guarded(() => revoke(id, k.id)) }, 'Revoke')));
  parts.push(el('h4', {}, 'Keys'), el('ul', { id: 'keys' }, ...keys));
  parts.push(el('button', { type: 'button', id: 'issue-key', onclick: () => guarded(() => issue(id)) }, 'Issue a key'));
  const routes = (usage && usage.routes) || [];
  parts.push(el('h4', {}, 'Usage now (not counted)'));
  parts.push(el('table', { id: 'usage' }, el('thead', {}, el('tr', {}, ...['route', 'limit', 'remaining', 'of', 'resets in'].map((h) => el('th', {}, h)))),
    el('tbody', {}, ...routes.flatMap((r) => r.limits.map((l) => el('tr', {},
      el('td', {}, r.route), el('td', {}, l.name), el('td', {}, l.remaining), el('td', {}, l.limit), el('td', {}, `${l.reset} s`)))))));
  $('#client-detail').replaceChildren(...parts);
}

async function create(id, plan) {
  const bad = badClientId(id);
  if (bad) { say(`${JSON.stringify(id)}: ${bad}`, true); return; }
  const { status, data } = await api('PUT', `/clients/${segment(id)}`, { plan });
  if (status >= 300) { say(refusal(data, status), true); return; }
  say(`client ${id} ${data.result || 'saved'}`);
  await clients();
  await detail(id);
}

async function issue(id) {
  const { status, data } = await api('POST', `/clients/${segment(id)}/keys`);
  if (status >= 300) { say(refusal(data, status), true); return; }
  await clients();
  await detail(id, data.key);
}

async function revoke(id, keyId) {
  const { status, data } = await api('DELETE', `/clients/${segment(id)}/keys/${segment(keyId)}`);
  if (status >= 300) { say(refusal(data, status), true); return; }
  say(`key ${keyId} revoked`);
  await clients();
  await detail(id);
}

document.addEventListener('DOMContentLoaded', () => {
  $('#sign-in-form').addEventListener('submit', (e) => { e.preventDefault(); signIn($('#token').value); });
  $('#sign-out').addEventListener('click', () => signOut(''));
  for (const b of document.querySelectorAll('#tabs [data-page]')) b.addEventListener('click', () => show(b.dataset.page));
  $('#lookup-form').addEventListener('submit', (e) => { e.preventDefault(); guarded(() => lookup($('#request-id').value.trim())); });
  $('#create-form').addEventListener('submit', (e) => { e.preventDefault(); guarded(() => create($('#new-id').value.trim(), $('#new-plan').value.trim())); });
  $('#client-search').addEventListener('input', refresh);
  const why = sessionStorage.getItem(SIGNED_OUT_KEY);
  sessionStorage.removeItem(SIGNED_OUT_KEY);
  if (why) $('#sign-in-error').textContent = why;
  if (state.token) signIn(state.token);
});
