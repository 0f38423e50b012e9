// Command validate checks quictun's deployment artefacts offline, where neither a
// Kubernetes API server, kubeconform's schemas nor promtool are at hand:
//
//	validate k8s [-external NAME,...] FILE...   rendered manifests (helm template output)
//	validate rules FILE...                      Prometheus rule files (promtool check rules)
//	validate dashboard FILE...                  Grafana dashboards: every PromQL expression parses
//	validate compose FILE...                    docker compose files, as "docker compose config" loads them
//
// Manifests are decoded strictly into the Kubernetes API types (unknown or
// duplicate fields are errors), then checked for what an API server or a
// scheduler would reject later: names and labels, selectors that match their pods,
// ports and volumes that are referenced by name, and the chart's security policy
// (non-root, read-only root file system, no privilege escalation, all
// capabilities dropped, a memory limit).
//
// It is a separate module so that the main module does not depend on k8s.io/api
// or Prometheus; deploy/helm/check.sh runs it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"

	composecli "github.com/compose-spec/compose-go/v2/cli"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "k8s":
		fs := flag.NewFlagSet("k8s", flag.ExitOnError)
		external := fs.String("external", "", "comma-separated Secret/ConfigMap names that exist outside the rendered manifests")
		_ = fs.Parse(os.Args[2:])
		err = checkK8s(fs.Args(), splitList(*external))
	case "rules":
		err = checkRules(os.Args[2:])
	case "dashboard":
		err = checkDashboards(os.Args[2:])
	case "compose":
		err = checkCompose(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: validate k8s [-external NAME,...] FILE... | rules FILE... | dashboard FILE... | compose FILE...")
	os.Exit(2)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// object is one decoded manifest and where it came from.
type object struct {
	where string
	kind  string
	meta  metav1.ObjectMeta
	obj   any
}

func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "batch/v1/Job":
		return &batchv1.Job{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("unexpected apiVersion %q kind %q", apiVersion, kind)
}

func readObjects(path string) ([]object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var out []object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		var head struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if head.Kind == "" && head.APIVersion == "" {
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue // empty document (a template rendered to nothing)
			}
			return nil, fmt.Errorf("%s: document %d: no apiVersion/kind", path, i)
		}
		where := fmt.Sprintf("%s: %s %q", path, head.Kind, head.Metadata.Name)
		obj, err := newObject(head.APIVersion, head.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s: strict decoding: %w", where, err)
		}
		out = append(out, object{where: where, kind: head.Kind, meta: head.Metadata, obj: obj})
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// checker collects every problem of one set of manifests.
type checker struct {
	errs []error
	objs []object
	// names of ConfigMaps and Secrets that exist (rendered or external)
	configMaps, secrets map[string]bool
}

func (c *checker) addf(where, format string, a ...any) {
	c.errs = append(c.errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, a...)))
}

func (c *checker) msgs(where, what string, msgs []string) {
	for _, m := range msgs {
		c.addf(where, "%s: %s", what, m)
	}
}

func checkK8s(paths, external []string) error {
	if len(paths) == 0 {
		return errors.New("k8s: no files")
	}
	var errs []error
	for _, p := range paths {
		objs, err := readObjects(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(objs) == 0 {
			errs = append(errs, fmt.Errorf("%s: no manifests", p))
			continue
		}
		c := &checker{objs: objs, configMaps: map[string]bool{}, secrets: map[string]bool{}}
		for _, n := range external {
			c.configMaps[n], c.secrets[n] = true, true
		}
		for _, o := range objs {
			switch o.kind {
			case "ConfigMap":
				c.configMaps[o.meta.Name] = true
			case "Secret":
				c.secrets[o.meta.Name] = true
			}
		}
		for _, o := range objs {
			c.checkObject(o)
		}
		errs = append(errs, c.errs...)
		fmt.Printf("%s: %d manifests checked\n", p, len(objs))
	}
	return errors.Join(errs...)
}

func (c *checker) checkObject(o object) {
	if o.meta.Name == "" {
		c.addf(o.where, "metadata.name is empty")
	}
	if o.kind == "Service" {
		c.msgs(o.where, "metadata.name", validation.IsDNS1035Label(o.meta.Name))
	} else {
		c.msgs(o.where, "metadata.name", validation.IsDNS1123Subdomain(o.meta.Name))
	}
	c.checkLabels(o.where+" metadata.labels", o.meta.Labels)
	for k := range o.meta.Annotations {
		c.msgs(o.where, "annotation key "+k, validation.IsQualifiedName(k))
	}
	switch v := o.obj.(type) {
	case *appsv1.Deployment:
		if v.Spec.Selector == nil || len(v.Spec.Selector.MatchLabels) == 0 {
			c.addf(o.where, "spec.selector.matchLabels is empty")
		} else if !labels.SelectorFromSet(v.Spec.Selector.MatchLabels).Matches(labels.Set(v.Spec.Template.Labels)) {
			c.addf(o.where, "spec.selector does not match the pod template's labels")
		}
		c.checkPod(o.where, &v.Spec.Template)
	case *batchv1.Job:
		c.checkPod(o.where, &v.Spec.Template)
		if p := v.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever && p != corev1.RestartPolicyOnFailure {
			c.addf(o.where, "a Job's restartPolicy must be Never or OnFailure, not %q", p)
		}
	case *corev1.Service:
		c.checkService(o.where, v)
	case *policyv1.PodDisruptionBudget:
		if (v.Spec.MinAvailable == nil) == (v.Spec.MaxUnavailable == nil) {
			c.addf(o.where, "set exactly one of minAvailable and maxUnavailable")
		}
		if v.Spec.Selector == nil || len(c.podsMatching(v.Spec.Selector.MatchLabels)) == 0 {
			c.addf(o.where, "selector matches no rendered pod template")
		}
	case *monitoringv1.ServiceMonitor:
		c.checkServiceMonitor(o.where, v)
	}
}

func (c *checker) checkLabels(where string, l map[string]string) {
	for k, v := range l {
		c.msgs(where, "key "+k, validation.IsQualifiedName(k))
		c.msgs(where, "value of "+k, validation.IsValidLabelValue(v))
	}
}

// pods returns every rendered pod template.
func (c *checker) pods() []*corev1.PodTemplateSpec {
	var out []*corev1.PodTemplateSpec
	for _, o := range c.objs {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			out = append(out, &v.Spec.Template)
		case *batchv1.Job:
			out = append(out, &v.Spec.Template)
		}
	}
	return out
}

func (c *checker) podsMatching(sel map[string]string) []*corev1.PodTemplateSpec {
	if len(sel) == 0 {
		return nil
	}
	var out []*corev1.PodTemplateSpec
	for _, p := range c.pods() {
		if labels.SelectorFromSet(sel).Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

func boolIs(p *bool, want bool) bool { return p != nil && *p == want }

func (c *checker) checkPod(where string, t *corev1.PodTemplateSpec) {
	c.checkLabels(where+" pod labels", t.Labels)
	s := &t.Spec
	if len(s.Containers) == 0 {
		c.addf(where, "no containers")
	}
	volumes := map[string]bool{}
	for _, v := range s.Volumes {
		c.msgs(where, "volume name", validation.IsDNS1123Label(v.Name))
		if volumes[v.Name] {
			c.addf(where, "volume %q defined twice", v.Name)
		}
		volumes[v.Name] = true
		if v.ConfigMap != nil && !c.configMaps[v.ConfigMap.Name] {
			c.addf(where, "volume %q: ConfigMap %q is neither rendered nor external", v.Name, v.ConfigMap.Name)
		}
		if v.Secret != nil && !c.secrets[v.Secret.SecretName] {
			c.addf(where, "volume %q: Secret %q is neither rendered nor external", v.Name, v.Secret.SecretName)
		}
	}
	podNonRoot := s.SecurityContext != nil && boolIs(s.SecurityContext.RunAsNonRoot, true)
	names := map[string]bool{}
	all := append(append([]corev1.Container{}, s.InitContainers...), s.Containers...)
	for _, ctr := range all {
		cw := fmt.Sprintf("%s container %q", where, ctr.Name)
		c.msgs(cw, "name", validation.IsDNS1123Label(ctr.Name))
		if names[ctr.Name] {
			c.addf(cw, "container name used twice")
		}
		names[ctr.Name] = true
		if ctr.Image == "" {
			c.addf(cw, "no image")
		}
		ports := map[string]corev1.ContainerPort{}
		for _, p := range ctr.Ports {
			if p.Name != "" {
				c.msgs(cw, "port name", validation.IsValidPortName(p.Name))
				if _, dup := ports[p.Name]; dup {
					c.addf(cw, "port name %q used twice", p.Name)
				}
				ports[p.Name] = p
			}
			c.msgs(cw, "containerPort", validation.IsValidPortNum(int(p.ContainerPort)))
		}
		for _, pr := range []struct {
			name  string
			probe *corev1.Probe
		}{{"livenessProbe", ctr.LivenessProbe}, {"readinessProbe", ctr.ReadinessProbe}, {"startupProbe", ctr.StartupProbe}} {
			if pr.probe == nil {
				continue
			}
			var port string
			switch {
			case pr.probe.HTTPGet != nil:
				port = pr.probe.HTTPGet.Port.StrVal
			case pr.probe.TCPSocket != nil:
				port = pr.probe.TCPSocket.Port.StrVal
			}
			if port != "" {
				if p, ok := ports[port]; !ok || (p.Protocol != "" && p.Protocol != corev1.ProtocolTCP) {
					c.addf(cw, "%s: no TCP port named %q", pr.name, port)
				}
			}
		}
		for _, m := range ctr.VolumeMounts {
			if !volumes[m.Name] {
				c.addf(cw, "volumeMount %q: no such volume", m.Name)
			}
		}
		// The chart's policy: what the hardened systemd units and the Dockerfile also do.
		sc := ctr.SecurityContext
		switch {
		case sc == nil:
			c.addf(cw, "no securityContext")
		default:
			if !boolIs(sc.ReadOnlyRootFilesystem, true) {
				c.addf(cw, "securityContext.readOnlyRootFilesystem must be true")
			}
			if !boolIs(sc.AllowPrivilegeEscalation, false) {
				c.addf(cw, "securityContext.allowPrivilegeEscalation must be false")
			}
			if !podNonRoot && !boolIs(sc.RunAsNonRoot, true) {
				c.addf(cw, "runAsNonRoot must be true (pod or container)")
			}
			if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
				c.addf(cw, "securityContext.capabilities.drop must be [ALL]")
			}
		}
		if _, ok := ctr.Resources.Limits[corev1.ResourceMemory]; !ok {
			c.addf(cw, "no memory limit")
		}
	}
}

func (c *checker) checkService(where string, s *corev1.Service) {
	if len(s.Spec.Selector) == 0 {
		c.addf(where, "no selector")
		return
	}
	pods := c.podsMatching(s.Spec.Selector)
	if len(pods) == 0 {
		c.addf(where, "selector matches no rendered pod template")
	}
	switch s.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, "":
	default:
		c.addf(where, "unexpected type %q", s.Spec.Type)
	}
	if s.Spec.ExternalTrafficPolicy != "" && (s.Spec.Type == corev1.ServiceTypeClusterIP || s.Spec.Type == "") {
		c.addf(where, "externalTrafficPolicy is only valid for NodePort and LoadBalancer")
	}
	for _, p := range s.Spec.Ports {
		c.msgs(where, "port", validation.IsValidPortNum(int(p.Port)))
		if p.NodePort != 0 {
			if s.Spec.Type != corev1.ServiceTypeNodePort && s.Spec.Type != corev1.ServiceTypeLoadBalancer {
				c.addf(where, "nodePort needs type NodePort or LoadBalancer")
			}
			if p.NodePort < 30000 || p.NodePort > 32767 {
				c.addf(where, "nodePort %d outside the default range 30000-32767", p.NodePort)
			}
		}
		if name := p.TargetPort.StrVal; name != "" {
			for _, pod := range pods {
				if !podHasPort(pod, name, p.Protocol) {
					c.addf(where, "targetPort %q (%s) is not a port of the selected pods", name, p.Protocol)
				}
			}
		}
	}
}

func podHasPort(p *corev1.PodTemplateSpec, name string, proto corev1.Protocol) bool {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, ctr := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, cp := range ctr.Ports {
			pp := cp.Protocol
			if pp == "" {
				pp = corev1.ProtocolTCP
			}
			if cp.Name == name && pp == proto {
				return true
			}
		}
	}
	return false
}

func (c *checker) checkServiceMonitor(where string, sm *monitoringv1.ServiceMonitor) {
	var svcs []*corev1.Service
	for _, o := range c.objs {
		if s, ok := o.obj.(*corev1.Service); ok && len(sm.Spec.Selector.MatchLabels) > 0 &&
			labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(o.meta.Labels)) {
			svcs = append(svcs, s)
		}
	}
	if len(svcs) == 0 {
		c.addf(where, "selector matches no rendered Service")
	}
	for _, ep := range sm.Spec.Endpoints {
		for _, s := range svcs {
			found := false
			for _, p := range s.Spec.Ports {
				found = found || p.Name == ep.Port
			}
			if !found {
				c.addf(where, "endpoint port %q is not a port of Service %q", ep.Port, s.Name)
			}
		}
		if a := ep.Authorization; a != nil && a.Credentials != nil && !c.secrets[a.Credentials.Name] {
			c.addf(where, "authorization Secret %q is neither rendered nor external", a.Credentials.Name)
		}
	}
}

func checkRules(paths []string) error {
	if len(paths) == 0 {
		return errors.New("rules: no files")
	}
	var errs []error
	for _, p := range paths {
		// rulefmt is what promtool check rules uses: YAML shape, PromQL, templates, duplicates.
		groups, es := rulefmt.ParseFile(p, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
		errs = append(errs, es...)
		if len(es) > 0 {
			continue
		}
		n := 0
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				n++
				if r.Alert != "" {
					if r.Labels["severity"] == "" {
						errs = append(errs, fmt.Errorf("%s: alert %s: no severity label", p, r.Alert))
					}
					if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
						errs = append(errs, fmt.Errorf("%s: alert %s: summary and description annotations are required", p, r.Alert))
					}
				}
			}
		}
		fmt.Printf("%s: %d rules in %d groups\n", p, n, len(groups.Groups))
	}
	return errors.Join(errs...)
}

// grafanaVar matches Grafana's template variables in an expression.
var grafanaVar = regexp.MustCompile(`\$(__rate_interval|__interval|__range|\{[a-zA-Z_]+\}|[a-zA-Z_]+)`)

func checkDashboards(paths []string) error {
	if len(paths) == 0 {
		return errors.New("dashboard: no files")
	}
	var errs []error
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var d any
		if err := json.Unmarshal(b, &d); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		n := 0
		walkExprs(d, func(expr string) {
			n++
			e := grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
				if strings.HasPrefix(v, "$__") {
					return "5m"
				}
				return ".*" // inside a =~ matcher
			})
			if strings.HasPrefix(e, "label_values(") {
				return // Grafana's own query function, not PromQL
			}
			if _, err := parser.NewParser(parser.Options{}).ParseExpr(e); err != nil {
				errs = append(errs, fmt.Errorf("%s: %q: %w", p, expr, err))
			}
		})
		if n == 0 {
			errs = append(errs, fmt.Errorf("%s: no expressions", p))
		}
		fmt.Printf("%s: %d expressions parsed\n", p, n)
	}
	return errors.Join(errs...)
}

// walkExprs calls fn for every "expr" string in a decoded JSON document.
func walkExprs(v any, fn func(string)) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if s, ok := x.(string); ok && k == "expr" {
				fn(s)
			} else {
				walkExprs(x, fn)
			}
		}
	case []any:
		for _, x := range t {
			walkExprs(x, fn)
		}
	}
}

// checkCompose loads each compose file with compose-go, the library behind
// "docker compose config": the compose specification's JSON schema, interpolation
// (variables from the environment and the file's .env), merge keys, and the
// consistency of references (networks, volumes, configs, secrets).
func checkCompose(paths []string) error {
	if len(paths) == 0 {
		return errors.New("compose: no files")
	}
	var errs []error
	for _, p := range paths {
		opts, err := composecli.NewProjectOptions([]string{p},
			composecli.WithOsEnv, composecli.WithDotEnv, composecli.WithConsistency(true))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		proj, err := opts.LoadProject(context.Background())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		for _, s := range proj.Services {
			for _, sec := range s.Secrets {
				def, ok := proj.Secrets[sec.Source]
				if !ok {
					errs = append(errs, fmt.Errorf("%s: service %s: undefined secret %s", p, s.Name, sec.Source))
					continue
				}
				if _, err := os.Stat(def.File); err != nil {
					errs = append(errs, fmt.Errorf("%s: secret %s: %w", p, sec.Source, err))
				}
			}
		}
		fmt.Printf("%s: project %q, %d services\n", p, proj.Name, len(proj.Services))
	}
	return errors.Join(errs...)
}
