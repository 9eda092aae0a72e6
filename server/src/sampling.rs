//! Head sampling in front of the OpenTelemetry layer: whether a trace is
//! kept is decided when its first span in this process is made, and a
//! trace that is not kept makes no spans at all.
//!
//! Why: `tracing-opentelemetry` builds a span's OpenTelemetry data (a
//! builder, its attributes formatted, timings) on every span it sees and
//! asks the sampler only when the span starts, so at a 1% ratio the other
//! 99% of requests would pay for spans nobody kept. Sampled here, traces
//! at 1% with export cost about 2% of a query's instructions
//! (docs/benchmarks.md, "Telemetry cost").
//!
//! The rule:
//! - traces start at a server's request span (`propagation::request_span`),
//!   which decides: as the caller's `traceparent` says, else with the
//!   configured ratio. A kept one is made with target [`KEPT`]; one not
//!   kept is `Span::none()`;
//! - any other span is made only under a kept span: the layer's filter
//!   ([`only_in_kept_traces`]) refuses it otherwise, before the registry
//!   allocates it, and a root that is not a request span is never made.
//!   Spans are children of the *current* span here; one made with an
//!   explicit parent must be made inside that parent (`in_scope`);
//! - [`HeadSampled`] marks the kept spans (a `Kept` marker) and passes only them,
//!   and the events inside them, to the OpenTelemetry layer.
//!
//! The tracer's own sampler is parent-based always-on: the decision was
//! made here.

use std::any::TypeId;

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

/// Target of a request span whose trace is kept.
pub const KEPT: &str = "shoal::trace::kept";

/// Marks a span whose trace is kept.
struct Kept;

/// The per-layer filter that goes with [`HeadSampled`]: a span is made
/// only as a kept request span or inside a kept span (the current span as
/// this layer sees it). Events pass; `HeadSampled` sorts them.
pub fn only_in_kept_traces<S>() -> impl Filter<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_subscriber::filter::dynamic_filter_fn(|meta: &Metadata<'_>, cx: &Context<'_, S>| {
        !meta.is_span()
            || match cx.lookup_current() {
                Some(s) => s.extensions().get::<Kept>().is_some(),
                None => meta.target() == KEPT,
            }
    })
}

/// Passes only the spans of kept traces (and events inside them) to `inner`.
pub struct HeadSampled<L> {
    inner: L,
}

impl<L> HeadSampled<L> {
    pub fn new(inner: L) -> Self {
        HeadSampled { inner }
    }
}

fn kept<S: Subscriber + for<'a> LookupSpan<'a>>(ctx: &Context<'_, S>, id: &Id) -> bool {
    ctx.span(id).is_some_and(|s| s.extensions().get::<Kept>().is_some())
}

impl<S, L> Layer<S> for HeadSampled<L>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    fn register_callsite(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        self.inner.register_callsite(meta)
    }

    fn enabled(&self, meta: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.enabled(meta, ctx)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = if let Some(p) = attrs.parent() {
            Some(p.clone())
        } else if attrs.is_contextual() {
            ctx.current_span().id().cloned()
        } else {
            None
        };
        let keep = match parent {
            Some(p) => kept(&ctx, &p),
            None => attrs.metadata().target() == KEPT,
        };
        if !keep {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Kept);
        }
        self.inner.on_new_span(attrs, id, ctx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if kept(&ctx, id) {
            self.inner.on_record(id, values, ctx);
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        if kept(&ctx, id) {
            self.inner.on_follows_from(id, follows, ctx);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // An event is recorded on its span: only a kept one wants it.
        let span = match event.parent() {
            Some(p) => Some(p.clone()),
            None if event.is_contextual() => ctx.current_span().id().cloned(),
            None => None,
        };
        if span.is_some_and(|s| kept(&ctx, &s)) {
            self.inner.on_event(event, ctx);
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if kept(&ctx, id) {
            self.inner.on_enter(id, ctx);
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if kept(&ctx, id) {
            self.inner.on_exit(id, ctx);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if kept(&ctx, &id) {
            self.inner.on_close(id, ctx);
        }
    }

    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }

    // `tracing-opentelemetry` finds its layer (and the span data behind
    // `OpenTelemetrySpanExt`) by downcasting the subscriber: the wrapper
    // must let that through.
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: forwarded to the inner layer, which answers for its own
        // types with pointers valid as long as `self` is.
        unsafe { self.inner.downcast_raw(id) }
    }
}
