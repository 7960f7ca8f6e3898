"""Recursive-descent parser: tokens to a `Module` syntax tree.

Grammar (informal):
    module   := 'model' NAME NL section*
    section  := 'config' NL INDENT (field | require)+ DEDENT
              | 'dim' NAME (',' NAME)* ['=' expr] NL
              | 'params' NL INDENT pdecl+ DEDENT
              | 'state' NAME ':' type NL
              | ('fn' | 'entry') NAME '(' args ')' ['updates' NAME (',' NAME)*] '->' type
                ['if' expr] NL block                    (the `if` on entries only)
    pdecl    := NAME (',' NAME)* ':' type ['=' expr] ['if' expr] NL
              | NAME '[' expr ']' ['as' NAME] NL INDENT pdecl+ DEDENT
    type     := NAME ['[' expr (',' expr)* ']'] ['?']
"""

from __future__ import annotations

from pathlib import Path

from linnet.core.diagnostics import Diagnostic, DiagnosticError
from linnet.syntax import ast as A
from linnet.syntax.lexer import Token, tokenize

BINARY_LEVELS = [
    {"or"},
    {"and"},
    {"==", "!=", "<", "<=", ">", ">="},
    {"+", "-"},
    {"*", "/", "//", "%", "@"},
]


class Parser:
    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.lines = text.split("\n")
        self.tokens = tokenize(text, path)
        self.i = 0

    # -- token helpers ---------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def at(self, *texts: str) -> bool:
        t = self.tok
        return t.kind in ("op", "keyword") and t.text in texts

    def advance(self) -> Token:
        t = self.tok
        self.i += 1
        return t

    def fail(
        self, message: str, tok: Token | None = None, hint: str | None = None, closing: bool = False
    ) -> None:
        t = tok or self.tok
        prev = self.tokens[self.i - 1] if self.i else t
        if closing and t.opener is not None and (t.line > prev.line or t.kind in ("eof", "dedent")):
            o = t.opener  # a bracket left open swallowed the line break: blame the bracket
            raise DiagnosticError(
                Diagnostic(
                    self.path,
                    o.line,
                    o.col,
                    o.end_col,
                    f"`{o.text}` is never closed",
                    source_line=self.lines[o.line - 1],
                    hint=f"close it before the end of line "
                    f"{o.line}, or continue the expression on the next line",
                )
            )
        found = {
            "newline": "end of line",
            "indent": "an indented block",
            "dedent": "end of block",
            "eof": "end of file",
        }.get(t.kind, f"`{t.text}`")
        raise DiagnosticError(
            Diagnostic(
                self.path,
                t.line,
                t.col,
                t.end_col,
                message,
                received=found,
                source_line=self.lines[t.line - 1],
                hint=hint,
            )
        )

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            self.fail(
                f"expected `{text}`" + (f" {what}" if what else ""), closing=text in (")", "]", ",")
            )
        return self.advance()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            self.fail(f"expected {what}")
        return self.advance()

    def name(self, what: str = "a name") -> Token:
        return self.expect_kind("name", what)

    def newline(self) -> None:
        self.expect_kind("newline", "end of line")

    def span(self, t: Token) -> A.Span:
        return A.Span(t.line, t.col, t.end_col)

    def span_to(self, start: Token) -> A.Span:
        prev = self.tokens[self.i - 1]
        end = prev.end_col if prev.line == start.line else len(self.lines[start.line - 1]) + 1
        return A.Span(start.line, start.col, end)

    # -- module ----------------------------------------------------------------
    def module(self) -> A.Module:
        while self.tok.kind == "newline":
            self.advance()
        self.expect("model", "at the start of a source (`model NAME`)")
        mod = A.Module(self.path, self.lines, self.name("the model name").text)
        self.newline()
        while self.tok.kind != "eof":
            self.section(mod)
        return mod

    def section(self, mod: A.Module) -> None:
        if self.at("config"):
            self.config(mod)
        elif self.tok.kind == "name" and self.tok.text == "dim":  # `dim` is a field name too
            self.dims(mod)
        elif self.at("params"):
            self.advance()
            self.newline()
            mod.params.extend(self.param_body())
        elif self.at("state"):
            start = self.advance()
            name = self.name("the state name").text
            self.expect(":")
            mod.states.append(A.StateDecl(self.span(start), name, self.type_ref()))
            self.newline()
        elif self.at("fn", "entry"):
            mod.fns.append(self.function())
        else:
            self.fail("expected a section: config, dim, params, state, fn or entry")

    def config(self, mod: A.Module) -> None:
        self.advance()
        self.newline()
        self.expect_kind("indent", "an indented list of config fields")
        while self.tok.kind != "dedent":
            if self.at("require"):
                start = self.advance()
                mod.constraints.append(A.Require(self.span(start), self.expr()))
            else:
                start = self.name("a config field")
                self.expect(":", "after the field name")
                type_ = self.type_ref()
                default = self.expr() if self.at("=") and self.advance() else None
                mod.fields.append(A.Field(self.span(start), start.text, type_, default))
            self.newline()
        self.advance()

    def dims(self, mod: A.Module) -> None:
        self.advance()
        names = [self.name("a dim name")]
        while self.at(","):
            self.advance()
            names.append(self.name("a dim name"))
        value = self.expr() if self.at("=") and self.advance() else None
        if value is not None and len(names) > 1:
            self.fail("only one dim can be given a value per line", names[1])
        for t in names:
            mod.dims.append(A.DimDecl(self.span(t), t.text, value))
        self.newline()

    def param_body(self) -> list[A.ParamDecl | A.ParamBlock]:
        self.expect_kind("indent", "an indented list of params")
        out: list[A.ParamDecl | A.ParamBlock] = []
        while self.tok.kind != "dedent":
            start = self.name("a param name")
            if self.at("["):
                self.advance()
                count = self.expr()
                self.expect("]")
                index = None
                if self.tok.kind == "name" and self.tok.text == "as":  # `as` is no keyword
                    self.advance()
                    index = self.name("the block's index name").text
                self.newline()
                body = self.param_body()
                out.append(A.ParamBlock(self.span(start), start.text, count, body, index))
                continue
            names = [start]
            while self.at(","):
                self.advance()
                names.append(self.name("a param name"))
            self.expect(":", "after the param name")
            type_ = self.type_ref()
            alias = self.expr() if self.at("=") and self.advance() else None
            cond = self.expr() if self.at("if") and self.advance() else None
            if alias is not None and cond is None:
                self.fail("an aliased param needs a condition (`= embed if tied`)")
            out.extend(A.ParamDecl(self.span(t), t.text, type_, alias, cond) for t in names)
            self.newline()
        self.advance()
        return out

    def type_ref(self) -> A.TypeRef:
        start = self.tok
        if self.tok.kind not in ("name", "keyword") or self.tok.text == "none":
            self.fail("expected a type")
        name = self.advance().text
        dims = None
        if self.at("["):
            self.advance()
            dims = [self.expr()]
            while self.at(","):
                self.advance()
                dims.append(self.expr())
            self.expect("]", "to close the shape")
        optional = bool(self.at("?") and self.advance())
        return A.TypeRef(self.span_to(start), name, dims, optional)

    def function(self) -> A.FnDef:
        start = self.advance()
        name = self.name("the function name").text
        self.expect("(")
        args: list[A.Arg] = []
        while not self.at(")"):
            t = self.name("an argument name")
            self.expect(":", "after the argument name")
            type_ = self.type_ref()
            default = self.expr() if self.at("=") and self.advance() else None
            args.append(A.Arg(self.span(t), t.text, type_, default))
            if not self.at(")"):
                self.expect(",", "between arguments")
        self.advance()
        updates: list[str] = []
        if self.at("updates"):
            self.advance()
            updates.append(self.name("a state name").text)
            while self.at(","):
                self.advance()
                updates.append(self.name("a state name").text)
        self.expect("->", "before the return type")
        ret = self.type_ref()
        cond = None
        if start.text == "entry" and self.at("if"):  # an entry only some configs have
            self.advance()
            cond = self.expr()
        self.newline()
        body = self.block()
        return A.FnDef(self.span(start), start.text, name, args, ret, updates, body, cond)

    # -- statements -------------------------------------------------------------
    def block(self) -> list[A.Stmt]:
        self.expect_kind("indent", "an indented block")
        body = []
        while self.tok.kind != "dedent":
            body.append(self.statement())
        self.advance()
        return body

    def statement(self) -> A.Stmt:
        start = self.tok
        if self.at("return"):
            self.advance()
            value = self.expr()
            self.newline()
            return A.Return(self.span_to(start), value)
        if self.at("require"):
            self.advance()
            cond = self.expr()
            stmt = A.Require(self.span_to(start), cond)
            self.newline()
            return stmt
        if self.at("if"):
            self.advance()
            cond = self.expr()
            self.newline()
            then = self.block()
            orelse: list[A.Stmt] = []
            if self.at("else"):
                self.advance()
                self.newline()
                orelse = self.block()
            return A.If(self.span(start), cond, then, orelse)
        if self.at("for"):
            return self.for_loop()
        return self.assignment()

    def for_loop(self) -> A.For:
        start = self.advance()
        first = self.name("a loop variable").text
        index, item = None, first
        if self.at(","):
            self.advance()
            index, item = first, self.name("a loop variable").text
        self.expect("in")
        iterable = self.expr()
        self.newline()
        return A.For(self.span(start), index, item, iterable, self.block())

    def assignment(self) -> A.Stmt:
        start = self.tok
        target = self.postfix()
        targets = [target]
        while self.at(","):
            self.advance()
            targets.append(self.postfix())
        if not self.at("="):
            self.fail(
                "expected `=`: a statement is an assignment, `return`, `if`, `for` or `require`",
                hint="an expression on its own has no effect",
            )
        self.advance()
        value = self.expr()
        if len(targets) > 1 and self.at(","):
            items = [value]
            while self.at(","):
                self.advance()
                items.append(self.expr())
            value = A.Tuple(value.span, items)
        span = self.span_to(start)
        self.newline()
        if len(targets) == 1 and isinstance(target, A.Index) and isinstance(target.value, A.Name):
            return A.IndexAssign(span, target.value, target.items, value)
        for t in targets:
            if not isinstance(t, A.Name):
                raise DiagnosticError(
                    Diagnostic(
                        self.path,
                        t.span.line,
                        t.span.col,
                        t.span.end_col,
                        "can only assign to a name or to a slice of state",
                        source_line=self.lines[t.span.line - 1],
                    )
                )
        return A.Assign(span, targets, value)

    # -- expressions --------------------------------------------------------------
    def expr(self, level: int = 0) -> A.Expr:
        if level == len(BINARY_LEVELS):
            return self.unary()
        if level == 2 and self.at("not"):
            start = self.advance()
            operand = self.expr(level)
            return A.Unary(A.Span(start.line, start.col, operand.span.end_col), "not", operand)
        left = self.expr(level + 1)
        while self.at(*BINARY_LEVELS[level]):
            op = self.advance().text
            right = self.expr(level + 1)
            left = A.BinOp(_join(left.span, right.span), op, left, right)
        return left

    def unary(self) -> A.Expr:
        if self.at("-"):
            start = self.advance()
            operand = self.unary()
            return A.Unary(A.Span(start.line, start.col, operand.span.end_col), "-", operand)
        return self.postfix()

    def postfix(self) -> A.Expr:
        node = self.atom()
        while self.at("[", ".", "("):
            if self.at("("):
                if not isinstance(node, A.Name):
                    self.fail("only named functions can be called")
                node = self.call(node)
            elif self.at("."):
                self.advance()
                attr = self.name("an attribute name")
                node = A.Attr(A.Span(node.span.line, node.span.col, attr.end_col), node, attr.text)
            else:
                self.advance()
                items = [self.index_item()]
                while self.at(","):
                    self.advance()
                    items.append(self.index_item())
                end = self.expect("]", "to close the index")
                node = A.Index(A.Span(node.span.line, node.span.col, end.end_col), node, items)
        return node

    def call(self, func: A.Name) -> A.Call:
        self.advance()
        args: list[A.Expr] = []
        kwargs: dict[str, A.Expr] = {}
        kw_spans: dict[str, A.Span] = {}
        while not self.at(")"):
            if self.tok.kind == "name" and self.tokens[self.i + 1].text == "=":
                key = self.advance()
                self.advance()
                if key.text in kwargs:
                    self.fail(f"keyword argument `{key.text}` given twice", key)
                kwargs[key.text] = self.expr()
                kw_spans[key.text] = self.span(key)
            else:
                if kwargs:
                    self.fail("positional argument after a keyword argument")
                args.append(self.expr())
            if not self.at(")"):
                self.expect(",", "between arguments")
        end = self.advance()
        return A.Call(
            A.Span(func.span.line, func.span.col, end.end_col), func.id, args, kwargs, kw_spans
        )

    def index_item(self) -> A.Expr:
        start = self.tok
        lo = None if self.at(":") else self.expr()
        if not self.at(":"):
            return lo
        self.advance()
        hi = None if self.at(",", "]") else self.expr()
        return A.Slice(self.span_to(start), lo, hi)

    def atom(self) -> A.Expr:
        t = self.tok
        span = self.span(t)
        if t.kind == "int":
            if len(t.text) > MAX_DIGITS:  # int() refuses past 4300 digits; no size needs 20
                self.fail(f"a number of {len(t.text)} digits is not a size or a count", t)
            self.advance()
            return A.Num(span, int(t.text))
        if t.kind == "float":
            self.advance()
            return A.Num(span, float(t.text))
        if t.kind == "string":
            self.advance()
            return A.Str(span, t.text[1:-1])
        if t.kind == "name":
            self.advance()
            return A.Name(span, t.text)
        if self.at("true", "false", "none"):
            self.advance()
            return A.Const(span, {"true": True, "false": False, "none": None}[t.text])
        if self.at("("):
            self.advance()
            inner = self.expr()
            self.expect(")", "to close the parenthesis")
            return inner
        if self.at("["):  # a list literal: an `int[N]` config field's default
            self.advance()
            items = [self.expr()]
            while self.at(","):
                self.advance()
                items.append(self.expr())
            end = self.expect("]", "to close the list")
            return A.ListLit(A.Span(t.line, t.col, end.end_col), items)
        self.fail("expected an expression")
        raise AssertionError  # unreachable


def _join(a: A.Span, b: A.Span) -> A.Span:
    return A.Span(a.line, a.col, b.end_col if b.line == a.line else a.end_col)


MAX_DIGITS = 100


def parse(text: str, path: str = "<source>") -> A.Module:
    """Parse a source; raises DiagnosticError at the first syntax error."""
    parser = Parser(text.replace("\r\n", "\n"), path)
    try:
        return parser.module()
    except RecursionError:  # brackets nested past Python's stack: an error at the deepest one
        parser.fail("expression nested too deeply")


def parse_file(path: str | Path) -> A.Module:
    path = Path(path)
    return parse(path.read_text(encoding="utf-8"), str(path))
