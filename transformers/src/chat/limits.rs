//! What bounds a chat template's render: a template is untrusted input (it ships with the
//! model), so its instructions, the nesting of the values it builds, its output and the
//! layout work of `pprint` and `tojson` all have limits, each an error when reached.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// The instructions one render may execute: a fixed base plus a share per message. Real
/// templates spend 19 to 34 per message and at most about 65 besides (ChatML, SmolLM2 and
/// Llama 3.1 over 1 to 1000 messages), so this leaves them more than tenfold room, while a
/// runaway loop stops within a fraction of a second.
pub(super) fn template_fuel(messages: usize) -> u64 {
    50_000 + 500 * messages as u64
}

/// Stack reserved per instruction of fuel for a render. A template can nest a value one
/// level deeper per instruction (`{% set ns.x = [[ns.x]] %}` in a loop), and printing,
/// comparing, hashing, serializing and dropping such a value recurse once per level: a
/// release build spent up to 670 bytes a level (comparing two nested lists), and a value
/// nested 300 000 deep overflowed 16 MiB when dropped. The reservation is virtual: a real
/// template touches a few pages of it.
pub(super) const STACK_PER_FUEL: u64 = 2 << 10;

/// The largest prompt a render may write; past it the render stops with an error, so a
/// template printing a value that shares itself (`[ns.x, ns.x]` doubled in a loop) ends
/// instead of writing until memory runs out.
const MAX_OUTPUT: usize = 64 << 20;

/// The layout work `pprint` and `tojson` may spend on one value, in bytes of output (or, for
/// `pprint`, steps of its indenting writer). Both lay out the whole expanded value at once,
/// and their indentation repeats each level's prefix on every line below it: `tojson` with an
/// indent writes O(depth²) bytes for a chain, `pprint` spends O(depth³) steps (2 s at 1000
/// levels, a minute at 3000, which a template builds with a few hundred instructions), and a
/// value that shares itself (`[ns.x, ns.x]` doubled in a loop) expands exponentially.
const LAYOUT_BUDGET: u64 = MAX_OUTPUT as u64;

/// The widest `tojson` indent: Python accepts any, but each level writes it once per line.
const MAX_INDENT: u64 = 64;

/// Checks that laying out `value` costs at most [`LAYOUT_BUDGET`], where a node `depth`
/// levels down costs `cost(depth)`. Walks the expanded value iteratively (a template can nest
/// values deeper than any stack) and stops at the budget; lazy iterables count as one node,
/// since walking them could consume them.
fn check_layout(value: &Value, cost: impl Fn(u64) -> u64) -> Result<(), Error> {
    let mut spent = 0u64;
    let mut todo = vec![(value.clone(), 0u64)];
    while let Some((v, depth)) = todo.pop() {
        spent = spent.saturating_add(cost(depth));
        if spent > LAYOUT_BUDGET {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "the value is too large or too deeply nested to lay out (more than {} MiB of layout work)",
                    LAYOUT_BUDGET >> 20
                ),
            ));
        }
        match v.kind() {
            ValueKind::Seq => todo.extend(v.try_iter()?.map(|item| (item, depth + 1))),
            ValueKind::Map => {
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    todo.push((key, depth + 1));
                    todo.push((item, depth + 1));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `pprint` within the layout budget: its indenting writer passes every byte through one
/// adapter per enclosing level, so a node `depth` levels down costs about depth² steps.
pub(super) fn pprint(value: &Value) -> Result<String, Error> {
    check_layout(value, |depth| (depth + 1).saturating_mul(depth + 1))?;
    Ok(minijinja::filters::pprint(value))
}

/// `tojson` within the layout budget: a node costs its text (about 8 bytes) plus its
/// indentation, `depth` times the indent.
pub(super) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let given = match &indent {
        Some(v) => Some(v.clone()),
        None => kwargs.peek::<Option<Value>>("indent")?,
    };
    let width = match given {
        None => 0,
        Some(v) => match bool::try_from(v.clone()) {
            Ok(pretty) => 2 * u64::from(pretty),
            Err(_) => u64::try_from(v)?,
        },
    };
    if width > MAX_INDENT {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson indent {width} is wider than {MAX_INDENT}"),
        ));
    }
    check_layout(value, |depth| 8 + depth.saturating_mul(width))?;
    minijinja::filters::tojson(value, indent, kwargs)
}

/// The rendered prompt, refusing to grow past [`MAX_OUTPUT`].
pub(super) struct BoundedOutput(pub(super) Vec<u8>);

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT {
            return Err(std::io::Error::other(format!(
                "the rendered prompt exceeds {} MiB",
                MAX_OUTPUT >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
