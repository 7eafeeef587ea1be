//! The metrics endpoint (`--metrics-listen ADDR`): Prometheus metrics and a health check over
//! HTTP, served from the placement master's executor so that a scrape never runs on a serving
//! shard.
//!
//! - `GET /metrics`: every STAT figure of the general, `io`, `segments` and `placement` groups,
//!   and the request latency histograms, in the Prometheus text format (0.0.4), or OpenMetrics
//!   1.0 when the scraper's `Accept` names `application/openmetrics-text` (Prometheus does).
//!   The `prometheus-client` crate writes both formats; nothing here writes exposition syntax.
//! - `GET /health` (and `/healthz`): `200 ok` while the server serves, `503` while it starts
//!   or stops (for load balancers).
//!
//! Names come from explicit tables ([`GENERAL`], [`IO`], [`SEGMENTS`], [`PLACEMENT`],
//! [`PLACEMENT_BY_NODE`]): each STAT name maps to a metric (name, type, unit, labels, help) or
//! is skipped with a reason. The unit tests check that every name each STAT group can produce
//! is in its table, so a new STAT figure cannot silently miss the endpoint.
//!
//! A scrape asks every shard for its per-core figures (`ShardRequest::Stats`, one mesh message
//! each, answered synchronously as for STAT), reads every partition's figures under its lock
//! (as STAT does) and the placement master's figures in place, then encodes. HTTP parsing is
//! `httparse` on a request head capped at [`HEAD_MAX_BYTES`]; one request per connection, then
//! `Connection: close`. Slow or idle clients cannot lock `/health` out: a head must arrive
//! within `HEAD_DEADLINE` of the accept, and at the connection cap a newcomer takes the place
//! of the oldest connection still without its head (`Slots`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::channel_mesh::Senders;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::registry::Registry;

pub use super::metric_table::{
    Export, Kind, Labels, Metric, Scale, Unit, GENERAL, IO, PLACEMENT, PLACEMENT_BY_NODE, PREFIX,
    REQUEST_DURATION, SEGMENTS,
};
use crate::server::shard::ctx::{Calls, MasterSnapshot, Message, ShardReply, ShardRequest};
use crate::server::shard::latency::{CommandKind, LatencySnapshot, BOUNDS_NS};
use crate::server::shard::shared::Shared;

/// The longest request head read (request line and headers); longer gets 431.
pub const HEAD_MAX_BYTES: usize = 8 << 10;
/// Metrics connections served at once. At the cap a new connection takes the place of the
/// oldest one still waiting for its request head ([`Slots`]); only when every one is past its
/// head (being answered) is the new one closed on accept.
const CONNECTIONS_MAX: usize = 16;
/// A request head must arrive whole within this long of the accept, however it trickles in.
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// A reply must be taken whole within this long.
const REPLY_DEADLINE: Duration = Duration::from_secs(10);
/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

fn lookup(table: &'static [(&'static str, Export)], name: &str) -> Option<&'static Export> {
    table.iter().find(|(n, _)| *n == name).map(|(_, e)| e)
}

// ---------------------------------------------------------------------------------------------
// Building the exposition from STAT pairs.

/// Everything one scrape exposes, as STAT gives it.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    pub general: Vec<(String, String)>,
    /// Per shard, its `io` pairs with the `shardN_` prefix taken off.
    pub io: Vec<Vec<(String, String)>>,
    pub segments: Vec<(String, String)>,
    pub placement: Vec<(String, String)>,
    pub latency: LatencySnapshot,
}

#[derive(Clone, Debug)]
enum Value {
    Int(u64),
    Float(f64),
    Info,
    Histogram {
        sum: f64,
        count: u64,
        /// (upper bound, count in this bucket alone).
        buckets: Vec<(f64, u64)>,
    },
}

#[derive(Clone, Debug)]
struct Sample {
    labels: Vec<(&'static str, String)>,
    value: Value,
}

#[derive(Clone, Debug)]
struct Family {
    metric: Metric,
    samples: Vec<Sample>,
}

/// The metric families of one scrape, in a stable order; a [`Collector`] the crate encodes.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
    /// STAT figures that could not be exposed (a name no table has, a value that is not a
    /// number): logged, never exposed. Always empty unless a STAT group changed unmapped.
    pub unmapped: Vec<String>,
}

impl Exposition {
    fn family(&mut self, metric: Metric) -> &mut Family {
        // One family per exposed name: name and unit (the kind only adds a suffix).
        let at = match self
            .families
            .iter()
            .position(|f| f.metric.name == metric.name && f.metric.unit == metric.unit)
        {
            Some(at) => at,
            None => {
                self.families.push(Family {
                    metric,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        debug_assert_eq!(
            self.families[at].metric, metric,
            "two table rows define one family differently"
        );
        &mut self.families[at]
    }

    fn push(&mut self, metric: Metric, labels: Vec<(&'static str, String)>, value: Value) {
        self.family(metric).samples.push(Sample { labels, value });
    }

    /// Adds one STAT pair exported as `export`, with the row's `labels`. Row labels and info
    /// labels are collected by the caller.
    fn add(&mut self, export: &Export, labels: &[(&'static str, String)], value: &str) {
        match *export {
            Export::Sample {
                metric,
                labels: fixed,
                scale,
            } => {
                let Some(value) = parse_value(value, scale) else {
                    self.unmapped.push(format!("{:?} (not a number)", value));
                    return;
                };
                let mut all = labels.to_vec();
                all.extend(fixed.iter().map(|&(k, v)| (k, v.to_string())));
                self.push(metric, all, value);
            }
            Export::Flag { metric, when } => {
                self.push(
                    metric,
                    labels.to_vec(),
                    Value::Int(u64::from(value == when)),
                );
            }
            Export::InfoLabel { .. } | Export::RowLabel(_) | Export::Skip(_) => {}
        }
    }

    /// Adds a group of `pairs` mapped by `table`, every sample labelled with `labels`; info
    /// labels of the group go on one info sample per info metric.
    fn add_group(
        &mut self,
        table: &'static [(&'static str, Export)],
        pairs: &[(String, String)],
        labels: &[(&'static str, String)],
        group: &str,
    ) {
        let mut infos: Vec<(Metric, Vec<(&'static str, String)>)> = Vec::new();
        for (name, value) in pairs {
            match lookup(table, name) {
                None => self.unmapped.push(format!("{group} {name}")),
                Some(Export::InfoLabel { metric, label }) => {
                    match infos.iter_mut().find(|(m, _)| m == metric) {
                        Some((_, l)) => l.push((label, value.clone())),
                        None => {
                            let mut l = labels.to_vec();
                            l.push((label, value.clone()));
                            infos.push((*metric, l));
                        }
                    }
                }
                Some(export) => self.add(export, labels, value),
            }
        }
        for (metric, labels) in infos {
            self.push(metric, labels, Value::Info);
        }
    }

    /// Builds every family of a scrape.
    pub fn build(scrape: &Scrape) -> Exposition {
        let mut out = Exposition::default();
        out.add_group(GENERAL, &scrape.general, &[], "general");
        for (shard, pairs) in scrape.io.iter().enumerate() {
            out.add_group(IO, pairs, &[("shard", shard.to_string())], "io");
        }
        // segments: target_N_field, grouped by target; the row labels first.
        let mut targets: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
        for (name, value) in &scrape.segments {
            let parsed = name.strip_prefix("target_").and_then(|rest| {
                let (id, field) = rest.split_once('_')?;
                Some((id.parse::<u64>().ok()?, field))
            });
            match parsed {
                Some((id, field)) => targets
                    .entry(id)
                    .or_default()
                    .push((field.to_string(), value.clone())),
                None => out.unmapped.push(format!("segments {name}")),
            }
        }
        for (id, fields) in &targets {
            let mut labels = vec![("target", id.to_string())];
            for (field, value) in fields {
                if let Some(Export::RowLabel(label)) = lookup(SEGMENTS, field) {
                    labels.push((label, value.clone()));
                }
            }
            out.add_group(SEGMENTS, fields, &labels, "segments");
        }
        // placement: fixed names, then the per-node rows.
        let (by_node, fixed): (Vec<_>, Vec<_>) = scrape
            .placement
            .iter()
            .cloned()
            .partition(|(name, _)| by_node_name(name).is_some());
        out.add_group(PLACEMENT, &fixed, &[], "placement");
        for (name, value) in &by_node {
            let Some((host, node, field)) = by_node_name(name) else {
                continue;
            };
            match lookup(PLACEMENT_BY_NODE, field) {
                Some(export) => out.add(
                    export,
                    &[("host", host.to_string()), ("node", node.to_string())],
                    value,
                ),
                None => out.unmapped.push(format!("placement {name}")),
            }
        }
        // Latency: one histogram per command kind, every kind present (zero until recorded).
        for kind in CommandKind::ALL {
            let row = scrape.latency.row(kind);
            let mut buckets: Vec<(f64, u64)> = BOUNDS_NS
                .iter()
                .zip(&row.buckets)
                .map(|(&bound, &count)| (bound as f64 / 1e9, count))
                .collect();
            buckets.push((f64::INFINITY, row.buckets[BOUNDS_NS.len()]));
            out.push(
                REQUEST_DURATION,
                vec![("command", kind.label().to_string())],
                Value::Histogram {
                    sum: row.sum_seconds(),
                    count: row.count(),
                    buckets,
                },
            );
        }
        out
    }

    /// The exposition in `format`, written by `prometheus-client`.
    pub fn render(self, format: Format) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?
            }
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
        }
        Ok(out)
    }
}

/// `{local|remote}_node_{N}_{field}` as (host, node, field).
fn by_node_name(name: &str) -> Option<(&'static str, &str, &str)> {
    let (host, rest) = if let Some(rest) = name.strip_prefix("local_node_") {
        ("local", rest)
    } else {
        ("remote", name.strip_prefix("remote_node_")?)
    };
    let (node, field) = rest.split_once('_')?;
    Some((host, node, field))
}

fn parse_value(text: &str, scale: Scale) -> Option<Value> {
    match scale {
        Scale::AsIs => text
            .parse::<u64>()
            .map(Value::Int)
            .ok()
            .or_else(|| text.parse::<f64>().ok().map(Value::Float)),
        Scale::NanosToSeconds => text.parse::<f64>().ok().map(|ns| Value::Float(ns / 1e9)),
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.families {
            if family.samples.is_empty() {
                continue;
            }
            let metric = &family.metric;
            let unit = metric.prometheus_unit();
            let mut descriptor = encoder.encode_descriptor(
                metric.name,
                metric.help,
                unit.as_ref(),
                metric.metric_type(),
            )?;
            for sample in &family.samples {
                let mut e = descriptor.encode_family(&sample.labels)?;
                match (&sample.value, metric.kind) {
                    (Value::Int(v), Kind::Counter) => {
                        e.encode_counter::<NoLabelSet, u64, u64>(v, None)?
                    }
                    (Value::Float(v), Kind::Counter) => {
                        e.encode_counter::<NoLabelSet, f64, f64>(v, None)?
                    }
                    (Value::Int(v), _) => match i64::try_from(*v) {
                        Ok(v) => e.encode_gauge(&v)?,
                        Err(_) => e.encode_gauge(&(*v as f64))?,
                    },
                    (Value::Float(v), _) => e.encode_gauge(v)?,
                    (Value::Info, _) => e.encode_info(&Vec::<(&str, &str)>::new())?,
                    (
                        Value::Histogram {
                            sum,
                            count,
                            buckets,
                        },
                        _,
                    ) => e.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

/// The exposition format a scraper gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (the default, `text/plain`).
    Prometheus,
    /// OpenMetrics 1.0 text, when the `Accept` header names it with a nonzero quality.
    OpenMetrics,
}

impl Format {
    pub fn from_accept(accept: Option<&str>) -> Format {
        let wanted = accept.is_some_and(|accept| {
            accept.split(',').any(|range| {
                let mut params = range.split(';').map(str::trim);
                let media = params.next().unwrap_or("");
                media.eq_ignore_ascii_case("application/openmetrics-text")
                    && params
                        .filter_map(|p| p.strip_prefix("q="))
                        .all(|q| q.parse::<f32>().map_or(true, |q| q > 0.0))
            })
        });
        if wanted {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => PROMETHEUS_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gathering, on the placement master's executor.

/// What the endpoint needs from the executor it runs on (the placement master's).
pub(crate) struct Source {
    pub shared: Arc<Shared>,
    pub mesh: Rc<Senders<Message>>,
    pub calls: Rc<Calls>,
    /// Every shard's mesh peer id, by shard index.
    pub shard_peers: Vec<usize>,
    /// The placement master's figures, read in place.
    pub master: Box<dyn Fn() -> MasterSnapshot>,
}

impl Source {
    /// Gathers one scrape; `None` when a shard no longer answers (the server stops).
    async fn scrape(&self) -> Option<Scrape> {
        let mut snapshots = Vec::with_capacity(self.shard_peers.len());
        for &peer in &self.shard_peers {
            match self.calls.call(&self.mesh, peer, ShardRequest::Stats).await {
                ShardReply::Stats(snapshot) => snapshots.push(*snapshot),
                _ => return None,
            }
        }
        let figures =
            crate::server::exec::stats::general_figures(&self.shared, snapshots.len(), &snapshots);
        let master = (self.master)();
        let mut latency = LatencySnapshot::default();
        for s in &snapshots {
            latency.merge(&s.latency);
        }
        Some(Scrape {
            general: crate::server::exec::stats::general_pairs(&figures),
            io: snapshots
                .iter()
                .enumerate()
                .map(|(shard, s)| {
                    let prefix = format!("shard{shard}_");
                    s.io.pairs(shard)
                        .into_iter()
                        .map(|(n, v)| (n.strip_prefix(&prefix).unwrap_or(&n).to_string(), v))
                        .collect()
                })
                .collect(),
            segments: crate::server::exec::stats::segments(&master),
            placement: crate::server::exec::stats::placement(&master),
            latency,
        })
    }
}

/// Binds the endpoint's listener (at start-up, before anything is mapped).
pub(crate) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    std::net::TcpListener::bind(addr).map_err(|err| {
        let why = match err.raw_os_error() {
            Some(libc::EADDRINUSE) => "the address is already in use".to_string(),
            Some(libc::EADDRNOTAVAIL) => "no interface of this machine has it".to_string(),
            Some(libc::EACCES) => {
                "permission denied (ports below 1024 need CAP_NET_BIND_SERVICE)".to_string()
            }
            _ => err.to_string(),
        };
        format!("--metrics-listen {addr}: cannot listen there: {why}")
    })
}

/// Serves the endpoint on the current executor (the placement master's) until it ends, in a
/// task queue of low shares: placement requests go first when both are ready.
pub(crate) fn spawn(listener: std::net::TcpListener, source: Source) {
    let queue = glommio::executor().create_task_queue(
        glommio::Shares::Static(100),
        glommio::Latency::NotImportant,
        "metrics",
    );
    let listener = crate::server::shard::listen::into_glommio(listener);
    let source = Rc::new(source);
    let spawned = glommio::spawn_local_into(
        async move {
            let slots = Rc::new(RefCell::new(Slots::default()));
            loop {
                let stream = match listener.accept().await {
                    Ok(stream) => stream,
                    Err(err) => {
                        tracing::warn!(%err, "metrics endpoint: accept failed");
                        glommio::timer::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let id = slots.borrow_mut().admit(stream.as_raw_fd());
                let (source, slots) = (Rc::clone(&source), Rc::clone(&slots));
                glommio::spawn_local(async move {
                    if let Err(err) = handle(&source, stream, &slots, id).await {
                        tracing::debug!(%err, "metrics endpoint: connection ended");
                    }
                    // In the poll that dropped the stream: its descriptor cannot have been
                    // reused by an accept yet.
                    slots.borrow_mut().open.remove(&id);
                })
                .detach();
            }
        },
        queue,
    );
    match spawned {
        Ok(task) => {
            task.detach();
        }
        Err(err) => tracing::error!(%err, "metrics endpoint: cannot start its task"),
    }
}

/// The endpoint's open connections, by accept order, and whether each still waits for its
/// request head. When the cap is reached a newcomer always gets a slot: the oldest connection
/// still without a request head is closed (slow or idle: a scraper or a health check sends its
/// head at once), else the oldest of all (one whose client requested and stopped reading, or
/// a slow scrape). So neither clients that connect and send nothing nor clients that request
/// `/metrics` and never read the answer can keep `/health` from answering.
#[derive(Default)]
struct Slots {
    next_id: u64,
    /// id -> (socket, waiting for its request head).
    open: BTreeMap<u64, (RawFd, bool)>,
}

impl Slots {
    /// Takes a new connection in, closing the oldest (still waiting for its head first) when
    /// every slot is taken: the newcomer's id.
    fn admit(&mut self, fd: RawFd) -> u64 {
        if self.open.len() >= CONNECTIONS_MAX {
            let waiting = self.open.iter().find(|(_, (_, waiting))| *waiting);
            if let Some((&oldest, &(old_fd, was_waiting))) = waiting.or(self.open.iter().next()) {
                self.open.remove(&oldest);
                // Its task owns the socket until its read or write ends; this ends it (0
                // bytes read, or a failed write).
                let both = nix::sys::socket::Shutdown::Both;
                if let Err(err) = nix::sys::socket::shutdown(old_fd, both) {
                    tracing::debug!(%err, "metrics endpoint: closing the oldest connection");
                }
                let which = if was_waiting {
                    "still without a request head"
                } else {
                    "being answered"
                };
                tracing::debug!("metrics endpoint: {CONNECTIONS_MAX} connections open; the oldest {which} is closed for a new one");
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(id, (fd, true));
        id
    }

    /// Connection `id` has its request head: it is not closed for newcomers any more.
    fn head_read(&mut self, id: u64) {
        if let Some((_, waiting)) = self.open.get_mut(&id) {
            *waiting = false;
        }
    }
}

/// Where the server is, as `/health` tells it: `None` while it serves, else why not.
fn state(shared: &Shared) -> Option<&'static str> {
    state_of(
        shared.serving.load(Ordering::Acquire),
        shared.stop.load(Ordering::Acquire),
    )
}

fn state_of(serving: bool, stopping: bool) -> Option<&'static str> {
    match (serving, stopping) {
        (_, true) => Some("stopping"),
        (false, false) => Some("starting"),
        (true, false) => None,
    }
}

/// A parsed request head: what the endpoint looks at.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub path: String,
    pub accept: Option<String>,
}

/// What a buffered request head is so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Complete(RequestHead),
    Partial,
    /// Answer with this status and close.
    Refuse(u16),
}

/// Parses `head` (the bytes read so far) with `httparse`.
pub fn parse_head(head: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {
            let accept = request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("accept"))
                .map(|h| String::from_utf8_lossy(h.value).into_owned());
            Parsed::Complete(RequestHead {
                method: request.method.unwrap_or("").to_string(),
                path: request.path.unwrap_or("").to_string(),
                accept,
            })
        }
        Ok(httparse::Status::Partial) if head.len() >= HEAD_MAX_BYTES => Parsed::Refuse(431),
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::Refuse(431),
        Err(_) => Parsed::Refuse(400),
    }
}

/// A whole response: status, content type, body.
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{body}\n"),
        }
    }

    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            _ => "Service Unavailable",
        };
        let allow = if self.status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if !head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// `io`, or a `TimedOut` error once `limit` has passed.
async fn within<T>(
    limit: Duration,
    io: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    futures_lite::future::or(io, async {
        glommio::timer::sleep(limit).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no progress within {limit:?}"),
        ))
    })
    .await
}

/// Reads a request head: the parsed head or the status to refuse it with; `None` when the
/// peer leaves first.
async fn read_head(
    stream: &mut glommio::net::TcpStream,
) -> std::io::Result<Option<Result<RequestHead, u16>>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&chunk[..n]);
        match parse_head(&head) {
            Parsed::Complete(request) => return Ok(Some(Ok(request))),
            Parsed::Partial => {}
            Parsed::Refuse(status) => return Ok(Some(Err(status))),
        }
    }
}

/// Answers one request on `stream` (slot `id` of `slots`), then closes it.
async fn handle(
    source: &Source,
    mut stream: glommio::net::TcpStream,
    slots: &RefCell<Slots>,
    id: u64,
) -> std::io::Result<()> {
    let Some(request) = within(HEAD_DEADLINE, read_head(&mut stream)).await? else {
        return Ok(()); // gone before a whole request
    };
    slots.borrow_mut().head_read(id);
    let (response, head_only) = match request {
        Err(status) => (Response::text(status, "bad request"), false),
        Ok(request) => {
            let head_only = request.method == "HEAD";
            (respond(source, &request).await, head_only)
        }
    };
    let bytes = response.bytes(head_only);
    within(REPLY_DEADLINE, async {
        stream.write_all(&bytes).await?;
        stream.close().await
    })
    .await
}

async fn respond(source: &Source, request: &RequestHead) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::text(405, "only GET and HEAD");
    }
    let path = request.path.split('?').next().unwrap_or("");
    match path {
        "/health" | "/healthz" => match state(&source.shared) {
            None => Response::text(200, "ok"),
            Some(state) => Response::text(503, state),
        },
        "/metrics" => {
            if let Some(state) = state(&source.shared) {
                return Response::text(503, state);
            }
            let Some(scrape) = source.scrape().await else {
                return Response::text(503, "stopping");
            };
            let exposition = Exposition::build(&scrape);
            for name in &exposition.unmapped {
                tracing::warn!(stat = %name, "metrics: a STAT figure cannot be exposed (a bug)");
            }
            let format = Format::from_accept(request.accept.as_deref());
            match exposition.render(format) {
                Ok(body) => Response {
                    status: 200,
                    content_type: format.content_type(),
                    body,
                },
                Err(_) => Response::text(500, "the metrics could not be encoded"),
            }
        }
        _ => Response::text(404, "not found: /metrics, /health, /healthz"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::exec::stats::{general_pairs, placement, segments, GeneralFigures};
    use crate::server::shard::ctx::{MasterSnapshot, TargetRow};

    /// Every table, named.
    const TABLES: [(&str, &[(&str, Export)]); 5] = [
        ("general", GENERAL),
        ("io", IO),
        ("segments", SEGMENTS),
        ("placement", PLACEMENT),
        ("placement by node", PLACEMENT_BY_NODE),
    ];

    fn names(pairs: &[(String, String)]) -> Vec<String> {
        pairs.iter().map(|(n, _)| n.clone()).collect()
    }

    /// A master with one target and one node row, so every name of both groups appears.
    fn master() -> MasterSnapshot {
        let mut master = MasterSnapshot {
            policy: "best_fit",
            ..Default::default()
        };
        master.targets.push(TargetRow {
            id: crate::placement::TargetId(3),
            spec: crate::segment::TargetSpec {
                name: "file:/data/segment-0".into(),
                uuid: 7,
                kind: crate::segment::TargetKind::File,
                host: 0,
                locality: Some(1),
                base: 0,
                size: 1 << 30,
                granule: 4096,
            },
            capacity: 1 << 30,
            used: 4096,
            largest_free: (1 << 30) - 4096,
            objects: 1,
            draining: false,
        });
        let local = master.stats.by_node.entry((true, Some(1))).or_default();
        local.capacity_bytes = 1 << 30;
        local.allocated_bytes = 4096;
        let remote = master.stats.by_node.entry((false, None)).or_default();
        remote.capacity_bytes = 1 << 20;
        master
    }

    #[test]
    fn every_general_stat_is_mapped_or_skipped() {
        let stat = names(&general_pairs(&GeneralFigures::default()));
        let missing: Vec<_> = stat
            .iter()
            .filter(|n| lookup(GENERAL, n).is_none())
            .collect();
        assert!(
            missing.is_empty(),
            "STAT figures with no row in metrics::GENERAL: {missing:?}"
        );
    }

    #[test]
    fn every_io_segments_and_placement_stat_is_mapped() {
        let io = crate::server::shard::wire::IoSnapshot::default().pairs(0);
        for (name, _) in &io {
            let field = name.strip_prefix("shard0_").unwrap();
            assert!(lookup(IO, field).is_some(), "io {field} has no row");
        }
        assert_eq!(io.len(), IO.len(), "io rows for names STAT no longer gives");
        let master = master();
        let segs = segments(&master);
        for (name, _) in &segs {
            let field = name.strip_prefix("target_3_").unwrap();
            assert!(lookup(SEGMENTS, field).is_some(), "segments {field}");
        }
        assert_eq!(segs.len(), SEGMENTS.len());
        let placement = placement(&master);
        let mut by_node = 0;
        for (name, _) in &placement {
            if let Some((_, _, field)) = by_node_name(name) {
                by_node += 1;
                assert!(lookup(PLACEMENT_BY_NODE, field).is_some(), "{name}");
            } else {
                assert!(lookup(PLACEMENT, name).is_some(), "placement {name}");
            }
        }
        assert_eq!(by_node, 4);
        assert_eq!(placement.len() - by_node, PLACEMENT.len());
        let exposition = Exposition::build(&Scrape {
            general: general_pairs(&GeneralFigures::default()),
            io: vec![io
                .iter()
                .map(|(n, v)| (n.strip_prefix("shard0_").unwrap().to_string(), v.clone()))
                .collect()],
            segments: segs,
            placement,
            latency: LatencySnapshot::default(),
        });
        assert!(exposition.unmapped.is_empty(), "{:?}", exposition.unmapped);
    }

    #[test]
    fn names_follow_the_conventions() {
        let mut families: BTreeMap<String, Metric> = BTreeMap::new();
        for (table, rows) in TABLES {
            for (stat, export) in rows {
                let metric = match export {
                    Export::Sample { metric, .. }
                    | Export::InfoLabel { metric, .. }
                    | Export::Flag { metric, .. } => *metric,
                    Export::RowLabel(_) => continue,
                    Export::Skip(why) => {
                        assert!(!why.is_empty(), "{table} {stat}: a skip says why");
                        continue;
                    }
                };
                let name = metric.name;
                assert!(
                    name.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                    "{name}"
                );
                for suffix in ["_total", "_bytes", "_seconds", "_info", "_count", "_sum"] {
                    assert!(!name.ends_with(suffix), "{name}: the encoder adds {suffix}");
                }
                assert!(
                    metric.help.ends_with('.') && metric.help.len() > 10,
                    "{name}: help is a sentence"
                );
                if let Some(other) = families.insert(metric.family_name(), metric) {
                    assert_eq!(other, metric, "{table} {stat}: one family, two definitions");
                }
                match metric.kind {
                    Kind::Counter => assert!(metric.sample_name().ends_with("_total")),
                    Kind::Info => assert!(metric.sample_name().ends_with("_info")),
                    _ => {}
                }
            }
        }
        // A counter's family name is its samples' name without `_total`: no gauge may take it.
        let samples: Vec<String> = families.values().map(|m| m.sample_name()).collect();
        let mut unique = samples.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            samples.len(),
            "two families share a sample name"
        );
        assert_eq!(
            REQUEST_DURATION.family_name(),
            "headroom_request_duration_seconds"
        );
    }

    #[test]
    fn both_formats_encode_counters_gauges_infos_and_histograms() {
        let mut general = general_pairs(&GeneralFigures {
            version: "1.6.45".into(),
            lock_hold_ns: [1024, 32768, 1 << 20],
            ..Default::default()
        });
        for (name, value) in general.iter_mut() {
            if name == "get_hits" {
                *value = "7".into();
            }
        }
        let latency = {
            let h = crate::server::shard::latency::LatencyHistograms::new();
            h.record(CommandKind::Get, 1_500, 3);
            h.record(CommandKind::Get, 20_000_000_000, 1);
            h.snapshot()
        };
        let scrape = Scrape {
            general,
            segments: segments(&master()),
            placement: placement(&master()),
            latency,
            ..Default::default()
        };
        let text = Exposition::build(&scrape)
            .render(Format::Prometheus)
            .unwrap();
        for line in [
            "# TYPE headroom_command_results_total counter",
            "headroom_command_results_total{command=\"get\",result=\"hit\"} 7",
            "headroom_build_info{memcached_version=\"1.6.45\",version=\"0.1.0\"} 1",
            "headroom_partition_lock_hold_p99_seconds 0.000032768",
            "headroom_request_duration_seconds_bucket{command=\"get\",le=\"2e-06\"} 3",
            "headroom_request_duration_seconds_bucket{command=\"get\",le=\"+Inf\"} 4",
            "headroom_request_duration_seconds_count{command=\"get\"} 4",
            "headroom_target_capacity_bytes{target=\"3\",kind=\"file\",host=\"0\",node=\"1\"} 1073741824",
            "headroom_target_draining{target=\"3\",kind=\"file\",host=\"0\",node=\"1\"} 0",
            "headroom_node_segment_capacity_bytes{host=\"remote\",node=\"unknown\"} 1048576",
            "headroom_placement_policy_info{policy=\"best_fit\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\nnot in\n{text}");
        }
        assert!(!text.contains("# EOF"));
        let open = Exposition::build(&scrape)
            .render(Format::OpenMetrics)
            .unwrap();
        assert!(open.ends_with("# EOF\n"));
        assert!(open.contains("# TYPE headroom_command_results counter\n"));
        assert!(open.contains("# UNIT headroom_read_bytes bytes\n"));
    }

    #[test]
    fn health_is_ok_only_while_serving() {
        assert_eq!(state_of(false, false), Some("starting"));
        assert_eq!(state_of(true, false), None);
        assert_eq!(state_of(true, true), Some("stopping"));
        assert_eq!(state_of(false, true), Some("stopping"));
    }

    #[test]
    fn accept_headers_choose_the_format() {
        let f = |a: Option<&str>| Format::from_accept(a);
        assert_eq!(f(None), Format::Prometheus);
        assert_eq!(f(Some("*/*")), Format::Prometheus);
        assert_eq!(f(Some("text/plain;version=0.0.4")), Format::Prometheus);
        // What Prometheus sends.
        assert_eq!(
            f(Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")),
            Format::OpenMetrics
        );
        assert_eq!(
            f(Some("application/openmetrics-text; q=0, text/plain")),
            Format::Prometheus
        );
    }

    #[test]
    fn request_heads_parse_or_are_refused() {
        let complete =
            parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: text/plain\r\n\r\n");
        assert_eq!(
            complete,
            Parsed::Complete(RequestHead {
                method: "GET".into(),
                path: "/metrics?x=1".into(),
                accept: Some("text/plain".into()),
            })
        );
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost:"),
            Parsed::Partial
        );
        assert_eq!(parse_head(b"\x00\x01garbage\r\n\r\n"), Parsed::Refuse(400));
        assert_eq!(
            parse_head(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"),
            Parsed::Refuse(400)
        );
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(HEAD_MAX_BYTES, b'a');
        assert_eq!(parse_head(&long), Parsed::Refuse(431));
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..100 {
            many.extend_from_slice(format!("X{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse_head(&many), Parsed::Refuse(431));
    }
}
