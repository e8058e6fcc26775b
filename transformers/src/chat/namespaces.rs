//! Keeps a chat template's namespaces out of its values. A namespace is the one mutable value
//! of a template, so storing one where a namespace can reach it (`{% set ns.x = ns %}`, or
//! through `[ns]`, an alias or a macro argument) makes a cycle, and minijinja then prints,
//! hashes or compares that value by recursing without end: no stack is deep enough. Real
//! templates use a namespace only through its attributes (`ns.found`, `ns.messages + [m]`),
//! so the template is checked before it compiles: a namespace-holding name may appear bare
//! only where no value can keep it (an attribute's base, a `set` target, a test, `{{ ns }}`),
//! or as the whole value of a `set` of a plain name (an alias, itself namespace-holding);
//! `namespace()` is called only as the whole value of such a `set`.

use std::collections::BTreeSet;

use minijinja::machinery::ast::{CallArg, Expr, Stmt};
use minijinja::machinery::{parse, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;

/// Checks `source` (see the module docs); a template that does not parse passes, so that the
/// compiler reports its syntax error.
pub(super) fn check(source: &str) -> Result<(), String> {
    let ws = WhitespaceConfig {
        keep_trailing_newline: false,
        lstrip_blocks: true,
        trim_blocks: true,
    };
    // A unit struct unless minijinja's `custom_syntax` feature is on somewhere in the build.
    #[allow(clippy::default_constructed_unit_structs)]
    let syntax = SyntaxConfig::default();
    let Ok(ast) = parse(source, "chat", syntax, ws) else {
        return Ok(());
    };
    // The names that hold namespaces: set from `namespace(...)`, then aliases of those.
    let mut holders = BTreeSet::new();
    loop {
        let before = holders.len();
        stmt(&ast, &mut Walk::Collect(&mut holders))?;
        if holders.len() == before {
            break;
        }
    }
    stmt(&ast, &mut Walk::Check(&holders))
}

/// The two passes over the tree: collecting the namespace-holding names, then checking.
enum Walk<'n, 'a> {
    Collect(&'n mut BTreeSet<&'a str>),
    Check(&'n BTreeSet<&'a str>),
}

impl<'a> Walk<'_, 'a> {
    fn holds(&self, name: &str) -> bool {
        match self {
            Walk::Collect(h) => h.contains(name),
            Walk::Check(h) => h.contains(name),
        }
    }
}

fn refused(line: u16, what: &str) -> String {
    format!(
        "line {line}: {what}: a namespace can be used only through its attributes (`ns.name`), \
         since a namespace stored in a value can come to contain itself"
    )
}

fn body<'a>(stmts: &[Stmt<'a>], w: &mut Walk<'_, 'a>) -> Result<(), String> {
    stmts.iter().try_for_each(|s| stmt(s, w))
}

fn stmt<'a>(s: &Stmt<'a>, w: &mut Walk<'_, 'a>) -> Result<(), String> {
    match s {
        Stmt::Template(t) => body(&t.children, w),
        Stmt::EmitExpr(e) => expr(&e.expr, Place::Kept(false), w),
        Stmt::EmitRaw(_) => Ok(()),
        Stmt::ForLoop(f) => {
            expr(&f.target, Place::Kept(false), w)?;
            expr(&f.iter, Place::Value, w)?;
            if let Some(e) = &f.filter_expr {
                expr(e, Place::Value, w)?;
            }
            body(&f.body, w)?;
            body(&f.else_body, w)
        }
        Stmt::IfCond(i) => {
            expr(&i.expr, Place::Value, w)?;
            body(&i.true_body, w)?;
            body(&i.false_body, w)
        }
        Stmt::WithBlock(b) => {
            for (target, value) in &b.assignments {
                expr(target, Place::Kept(false), w)?;
                expr(value, Place::Value, w)?;
            }
            body(&b.body, w)
        }
        Stmt::Set(s) => match &s.target {
            Expr::Var(name) => {
                let aliased = match &s.expr {
                    Expr::Var(v) => w.holds(v.id),
                    Expr::Call(c) => matches!(&c.expr, Expr::Var(f) if f.id == "namespace"),
                    _ => false,
                };
                if aliased {
                    if let Walk::Collect(h) = w {
                        h.insert(name.id);
                    }
                    expr(&s.expr, Place::Kept(true), w)
                } else {
                    expr(&s.expr, Place::Value, w)
                }
            }
            target => {
                expr(target, Place::Kept(false), w)?;
                expr(&s.expr, Place::Value, w)
            }
        },
        Stmt::SetBlock(b) => {
            expr(&b.target, Place::Kept(false), w)?;
            if let Some(f) = &b.filter {
                expr(f, Place::Value, w)?;
            }
            body(&b.body, w)
        }
        Stmt::AutoEscape(a) => {
            expr(&a.enabled, Place::Value, w)?;
            body(&a.body, w)
        }
        Stmt::FilterBlock(f) => {
            expr(&f.filter, Place::Value, w)?;
            body(&f.body, w)
        }
        Stmt::Block(b) => body(&b.body, w),
        Stmt::Import(i) => expr(&i.expr, Place::Value, w),
        Stmt::FromImport(i) => expr(&i.expr, Place::Value, w),
        Stmt::Extends(e) => expr(&e.name, Place::Value, w),
        Stmt::Include(i) => expr(&i.name, Place::Value, w),
        Stmt::Macro(m) => {
            m.defaults
                .iter()
                .try_for_each(|d| expr(d, Place::Value, w))?;
            body(&m.body, w)
        }
        Stmt::CallBlock(c) => {
            call_args(&c.call.args, w)?;
            expr(&c.call.expr, Place::Kept(false), w)?;
            body(&c.macro_decl.body, w)
        }
        Stmt::Continue(_) | Stmt::Break(_) => Ok(()),
        Stmt::Do(d) => {
            call_args(&d.call.args, w)?;
            expr(&d.call.expr, Place::Kept(false), w)
        }
    }
}

/// Where an expression's value goes.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// Into a value that may be stored: a namespace here would be kept.
    Value,
    /// Nowhere a namespace could be kept (an attribute's base, a test, output, a target);
    /// `true` for the whole value of a `set` of a plain name, the one place `namespace()`
    /// may be called.
    Kept(bool),
}

fn call_args<'a>(args: &[CallArg<'a>], w: &mut Walk<'_, 'a>) -> Result<(), String> {
    args.iter().try_for_each(|a| match a {
        CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => {
            expr(e, Place::Value, w)
        }
    })
}

fn expr<'a>(e: &Expr<'a>, place: Place, w: &mut Walk<'_, 'a>) -> Result<(), String> {
    let check = matches!(w, Walk::Check(_));
    match e {
        Expr::Var(v) => {
            if check && place == Place::Value && w.holds(v.id) {
                return Err(refused(
                    v.span().start_line,
                    &format!("`{}` is stored or passed on", v.id),
                ));
            }
            if check && v.id == "namespace" {
                return Err(refused(
                    v.span().start_line,
                    "`namespace` is used other than as `set name = namespace(...)`",
                ));
            }
            Ok(())
        }
        Expr::Const(_) => Ok(()),
        Expr::Slice(s) => {
            expr(&s.expr, Place::Value, w)?;
            [&s.start, &s.stop, &s.step]
                .into_iter()
                .flatten()
                .try_for_each(|e| expr(e, Place::Value, w))
        }
        Expr::UnaryOp(u) => expr(&u.expr, Place::Value, w),
        Expr::BinOp(b) => {
            expr(&b.left, Place::Value, w)?;
            expr(&b.right, Place::Value, w)
        }
        Expr::Compare(c) => {
            expr(&c.expr, Place::Value, w)?;
            c.ops
                .iter()
                .try_for_each(|o| expr(&o.expr, Place::Value, w))
        }
        Expr::IfExpr(i) => {
            expr(&i.test_expr, Place::Value, w)?;
            expr(&i.true_expr, Place::Value, w)?;
            i.false_expr
                .iter()
                .try_for_each(|e| expr(e, Place::Value, w))
        }
        Expr::Filter(f) => {
            f.expr.iter().try_for_each(|e| expr(e, Place::Value, w))?;
            call_args(&f.args, w)
        }
        Expr::Test(t) => {
            expr(&t.expr, Place::Kept(false), w)?;
            call_args(&t.args, w)
        }
        Expr::GetAttr(g) => expr(&g.expr, Place::Kept(false), w),
        Expr::GetItem(g) => {
            expr(&g.expr, Place::Kept(false), w)?;
            expr(&g.subscript_expr, Place::Value, w)
        }
        Expr::Call(c) => {
            call_args(&c.args, w)?;
            match &c.expr {
                Expr::Var(f) if f.id == "namespace" => {
                    if check && place != Place::Kept(true) {
                        return Err(refused(
                            c.span().start_line,
                            "`namespace()` is called other than as `set name = namespace(...)`",
                        ));
                    }
                    Ok(())
                }
                callee => expr(callee, Place::Kept(false), w),
            }
        }
        Expr::List(l) => l.items.iter().try_for_each(|e| expr(e, Place::Value, w)),
        Expr::Map(m) => m
            .keys
            .iter()
            .chain(&m.values)
            .try_for_each(|e| expr(e, Place::Value, w)),
    }
}
