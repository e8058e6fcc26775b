//! zoo-diffusers: diffusion model families and schedulers (filled by the diffusion issues).
