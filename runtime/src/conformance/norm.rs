//! RMS, layer and group norms and the `nn` layers built on them.

#[allow(unused_imports)]
use super::*;

pub(super) fn norm(c: &mut Ctx) {
    let norm_lane = |l: &[f64], eps: f64| -> Vec<f64> {
        let m = l.iter().sum::<f64>() / l.len() as f64;
        let v = l.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / l.len() as f64;
        l.iter().map(|x| (x - m) / (v + eps).sqrt()).collect()
    };
    for dt in FLOATS {
        let eps = 1e-5;
        let Some((x, xh)) = c.input(&[3, 4, 48], dt, Dist::Normal) else {
            return;
        };
        let Some((w, wh)) = c.input(&[48], dt, Dist::Normal) else {
            return;
        };
        let Some((b, bh)) = c.input(&[48], dt, Dist::Normal) else {
            return;
        };
        let shifted = xh.map(|v| v * 3.0 + 5.0);
        let Some((xs, xsh)) = c.tensor(&shifted.data, &shifted.shape, dt) else {
            return;
        };
        let ln = xsh.lanes(2, |l| norm_lane(l, eps));
        let want = Host::from_fn(&ln.shape, |i| ln.at(i) * wh.at(&[i[2]]) + bh.at(&[i[2]]));
        // Normalised values are O(1) but come from a mean-subtracted input of scale ~5; the
        // error bound follows the input's scale over its spread.
        let mag = Host::from_fn(&ln.shape, |i| {
            (ln.at(i).abs() + 2.0) * wh.at(&[i[2]]).abs() + bh.at(&[i[2]]).abs()
        });
        c.check(
            "layer_norm (shifted input)",
            xs.layer_norm(Some(&w), Some(&b), eps),
            &want,
            dt,
            Some(&mag),
        );
        c.check(
            "layer_norm no affine",
            x.layer_norm(None, None, eps),
            &xh.lanes(2, |l| norm_lane(l, eps)),
            dt,
            Some(&xh.lanes(2, |l| norm_lane(l, eps)).map(|v| v.abs() + 1.0)),
        );
        let rms = |l: &[f64]| -> Vec<f64> {
            let ms = l.iter().map(|x| x * x).sum::<f64>() / l.len() as f64;
            l.iter().map(|x| x / (ms + 1e-6).sqrt()).collect()
        };
        let r = xh.lanes(2, rms);
        // Llama rounds the normalised value to the input dtype before the weight multiply.
        let r_rounded = round_to(&r, dt);
        let want = Host::from_fn(&r.shape, |i| r_rounded.at(i) * wh.at(&[i[2]]));
        let mag = Host::from_fn(&r.shape, |i| r.at(i).abs() * wh.at(&[i[2]]).abs());
        c.check(
            "rms_norm",
            x.rms_norm(Some(&w), 1e-6),
            &want,
            dt,
            Some(&mag),
        );
        // Gemma's (1 + w) in f32, loaded through nn.
        let mut mw = MemWeights::new();
        mw.insert("norm.weight", w.clone());
        let weights = Weights::new(std::sync::Arc::new(mw), dt, c.device);
        let gemma = RmsNorm::load_gemma(&weights.pp("norm"), 48, 1e-6).and_then(|n| n.forward(&x));
        let want = Host::from_fn(&r.shape, |i| r.at(i) * (1.0 + wh.at(&[i[2]])));
        let mag = Host::from_fn(&r.shape, |i| r.at(i).abs() * (1.0 + wh.at(&[i[2]]).abs()));
        c.check("RmsNorm gemma (1 + w)", gemma, &want, dt, Some(&mag));

        let Some((g, gh)) = c.input(&[2, 6, 3, 5], dt, Dist::Normal) else {
            return;
        };
        let Some((gw, gwh)) = c.input(&[6], dt, Dist::Normal) else {
            return;
        };
        let Some((gb, gbh)) = c.input(&[6], dt, Dist::Normal) else {
            return;
        };
        let groups = 3;
        let grouped = Host::new(&[2, groups, 30], gh.data.clone()).lanes(2, |l| norm_lane(l, 1e-6));
        let gn = Host::new(&gh.shape, grouped.data);
        let want = Host::from_fn(&gh.shape, |i| gn.at(i) * gwh.at(&[i[1]]) + gbh.at(&[i[1]]));
        let mag = Host::from_fn(&gh.shape, |i| {
            (gn.at(i).abs() + 1.0) * gwh.at(&[i[1]]).abs() + gbh.at(&[i[1]]).abs()
        });
        c.check(
            "group_norm 3 groups",
            g.group_norm(groups, Some(&gw), Some(&gb), 1e-6),
            &want,
            dt,
            Some(&mag),
        );
    }
}
