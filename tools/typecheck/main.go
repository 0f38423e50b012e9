// Command typecheck type-checks Go packages, and with -test their tests, for
// another GOOS/GOARCH from source, without compiling them: `go list -deps`
// for the target picks the files its build constraints select, and go/types
// checks every package in dependency order, the standard library's too, with
// the target's sizes. It catches what keeps a package from compiling on that
// platform (an identifier golang.org/x/sys/unix defines for one architecture
// and not another, a type that differs, a file a build tag leaves out) and a
// function declared without a body in a package that has no assembly to
// supply it (the compiler's "missing function body"), at a few seconds of CPU
// a target where `go build` compiles the standard library and every
// dependency for it (70-80 s here with a cold build cache). It does not
// generate code or link: `make release` does that for every platform.
//
//	go run ./tools/typecheck -target darwin/amd64 [-test] PACKAGES...
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("typecheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "", "GOOS/GOARCH to check for (required)")
	tests := fs.Bool("test", false, "check the named packages' tests too")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	goos, goarch, ok := strings.Cut(*target, "/")
	if !ok || goos == "" || goarch == "" || fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: typecheck -target GOOS/GOARCH [-test] PACKAGES...")
		return 2
	}
	n, errs, err := check("", goos, goarch, *tests, fs.Args(), stdout)
	if err != nil {
		fmt.Fprintf(stderr, "typecheck %s: %v\n", *target, err)
		return 1
	}
	fmt.Fprintf(stdout, "typecheck %s: %d packages, %d errors\n", *target, n, errs)
	if errs > 0 {
		return 1
	}
	return 0
}

// listed is what check needs of `go list -json`.
type listed struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	Standard   bool
	// non-Go files: with none, the compiler requires every function to have
	// a body (go build passes -complete; the standard library has exceptions,
	// functions the runtime supplies, so it is left out of this check)
	SFiles, CFiles, CXXFiles, MFiles, FFiles, SysoFiles, SwigFiles, SwigCXXFiles []string
	ImportMap                                                                    map[string]string
	Module                                                                       *struct{ GoVersion string }
	Error                                                                        *struct{ Err string }
}

const listFields = "ImportPath,Name,Dir,GoFiles,Standard,SFiles,CFiles,CXXFiles,MFiles,FFiles,SysoFiles,SwigFiles,SwigCXXFiles,ImportMap,Module,Error"

// check type-checks patterns (in dir; "" is the current directory) and their
// dependencies for goos/goarch, printing each error to out; it returns how
// many packages it checked and how many errors it found, or an error when go
// list fails.
func check(dir, goos, goarch string, tests bool, patterns []string, out io.Writer) (n, errs int, err error) {
	args := []string{"list", "-e", "-deps", "-json=" + listFields}
	if tests {
		args = append(args, "-test")
	}
	cmd := exec.Command("go", append(append(args, "--"), patterns...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	cmd.Stderr = os.Stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("go list: %w", werr)
		}
	}()
	reported := map[string]bool{}
	report := func(format string, a ...any) { // once: a package's test variants repeat its errors
		if msg := fmt.Sprintf(format, a...); !reported[msg] {
			reported[msg] = true
			fmt.Fprintln(out, msg)
			errs++
		}
	}
	fset := token.NewFileSet()
	sizes := types.SizesFor("gc", goarch)
	if sizes == nil {
		_, _ = io.Copy(io.Discard, pipe)
		return 0, 0, fmt.Errorf("unknown GOARCH %q", goarch)
	}
	checked := map[string]*types.Package{"unsafe": types.Unsafe}
	dec := json.NewDecoder(pipe)
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			_, _ = io.Copy(io.Discard, pipe)
			return n, errs, fmt.Errorf("go list output: %w", err)
		}
		if p.ImportPath == "unsafe" {
			continue
		}
		if p.Error != nil {
			report("%s: %s", p.ImportPath, strings.TrimSpace(p.Error.Err))
			continue
		}
		files := make([]*ast.File, 0, len(p.GoFiles))
		for _, name := range p.GoFiles {
			if !filepath.IsAbs(name) { // a test main is generated in the build cache
				name = filepath.Join(p.Dir, name)
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				report("%v", err)
				continue
			}
			files = append(files, f)
		}
		conf := types.Config{
			Importer: importerFunc(func(path string) (*types.Package, error) {
				if m, ok := p.ImportMap[path]; ok {
					path = m
				}
				if tp := checked[path]; tp != nil {
					return tp, nil
				}
				return nil, fmt.Errorf("%s was not checked before its importer", path)
			}),
			Sizes: sizes,
			Error: func(err error) { report("%v", err) },
		}
		if p.Module != nil && p.Module.GoVersion != "" {
			conf.GoVersion = "go" + p.Module.GoVersion
		}
		// a test variant is listed as "path [path.test]"; its types use the plain path
		path, _, _ := strings.Cut(p.ImportPath, " ")
		tp, _ := conf.Check(path, fset, files, nil) // errors went to conf.Error
		checked[p.ImportPath] = tp
		n++
		if !p.Standard && len(p.SFiles)+len(p.CFiles)+len(p.CXXFiles)+len(p.MFiles)+len(p.FFiles)+len(p.SysoFiles)+
			len(p.SwigFiles)+len(p.SwigCXXFiles) == 0 {
			for _, pos := range missingBodies(files) {
				report("%s: missing function body", fset.Position(pos))
			}
		}
	}
	return n, errs, nil
}

// missingBodies returns where files (one package) declare a function without
// a body that no //go:linkname directive of the package names: the compiler
// rejects those in a package without assembly or other non-Go files.
func missingBodies(files []*ast.File) []token.Pos {
	linknamed := map[string]bool{}
	for _, f := range files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if rest, ok := strings.CutPrefix(c.Text, "//go:linkname "); ok {
					if fields := strings.Fields(rest); len(fields) > 0 {
						linknamed[fields[0]] = true
					}
				}
			}
		}
	}
	var missing []token.Pos
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body == nil && !linknamed[fd.Name.Name] {
				missing = append(missing, fd.Pos())
			}
		}
	}
	return missing
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
